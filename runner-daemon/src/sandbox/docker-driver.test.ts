import { randomBytes } from 'node:crypto';
import { Writable } from 'node:stream';
import Docker from 'dockerode';
import { createLogger } from '@agentplane/core';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { DockerDriver, SANDBOX_DEFAULTS, scratchSizes } from './docker-driver.js';
import { runawayBytes } from './output.js';
import { ensureSandboxImage } from './image.js';
import { materializeResources } from './resources.js';
import { createTar } from './tar.js';
import { SANDBOX_LABELS } from '@agentplane/sandbox';
import { assuranceFlags, driverSatisfies, EXEC_DEFAULTS, type ExecResult, type Sandbox } from './types.js';

const runnerId = `rtest-${randomBytes(4).toString('hex')}`;
const docker = new Docker();
const driver = new DockerDriver({ runnerId, docker });
const sid = (): string => `sess_${randomBytes(8).toString('hex')}`;
async function waitUntil(ok: () => boolean, ms = 10_000): Promise<void> {
  const until = Date.now() + ms;
  while (!ok()) {
    if (Date.now() > until) throw new Error('condition not met in time');
    await new Promise((r) => setTimeout(r, 20));
  }
}

beforeAll(async () => {
  await ensureSandboxImage({ docker });
}, 120_000);

afterAll(async () => {
  await driver.reapOrphans(runnerId, []);
});

/** An interrupted `sleep 600` was killed, within bound, and nothing of it is left in the sandbox. */
async function expectKilledInBound(sb: Sandbox, res: ExecResult, started: number): Promise<void> {
  expect(res.killed).toBe(true);
  expect(res.exitCode).toBe(137);
  // Bound: the 3 s cancel bound (then the container is killed) plus exec latency under load.
  expect(Date.now() - started).toBeLessThan(5_000);
  const ps = await driver.exec(sb, ['ps', '-eo', 'args']);
  expect(ps.stdout).not.toContain('sleep 600');
}

describe('docker sandbox driver', () => {
  it('keeps workspace files between commands, Runs and a container restart', async () => {
    const session = { id: sid() };
    const sb = await driver.ensure(session, {});
    expect(sb.reused).toBe(false);
    const w = await driver.exec(sb, { script: 'echo turn-one > notes.txt' });
    expect(w.exitCode).toBe(0);
    const r = await driver.exec(sb, ['cat', 'notes.txt']);
    expect(r.stdout).toBe('turn-one\n');

    const again = await driver.ensure(session, {});
    expect(again.reused).toBe(true);
    expect(again.ref).toBe(sb.ref);
    expect((await driver.exec(again, ['cat', '/workspace/notes.txt'])).stdout).toBe('turn-one\n');

    // The container dies (e.g. the daemon restarted it away): the workspace volume survives.
    await docker.getContainer(sb.ref).kill();
    const revived = await driver.ensure(session, {});
    expect((await driver.exec(revived, ['cat', 'notes.txt'])).stdout).toBe('turn-one\n');
    // Killed under a live handle (as when a cancel had to kill the container): the next command restarts it.
    await docker.getContainer(revived.ref).kill();
    expect((await driver.exec(revived, ['cat', 'notes.txt'])).stdout).toBe('turn-one\n');
    await driver.destroy(session.id);
    await expect(docker.getContainer(sb.ref).inspect()).rejects.toMatchObject({ statusCode: 404 });
  });

  it('has no network, a read-only root, a non-root user and no capabilities', async () => {
    const session = { id: sid() };
    const sb = await driver.ensure(session, {});
    const net = await driver.exec(sb, { script: 'exec 3<>/dev/tcp/1.1.1.1/80 && echo connected' }, { timeoutMs: 10_000 });
    expect(net.exitCode).not.toBe(0);
    expect(net.stdout).not.toContain('connected');
    const ifaces = await driver.exec(sb, ['ls', '/sys/class/net']);
    expect(ifaces.stdout.trim()).toBe('lo');

    const ro = await driver.exec(sb, { script: 'touch /usr/bin/evil' });
    expect(ro.exitCode).not.toBe(0);
    expect(ro.stderr).toContain('Read-only file system');
    expect((await driver.exec(sb, { script: 'echo ok > /tmp/t && cat /tmp/t' })).stdout).toBe('ok\n');

    const who = await driver.exec(sb, { script: 'id -u; grep CapEff /proc/self/status; grep NoNewPrivs /proc/self/status' });
    expect(who.stdout).toMatch(/^10001\n/);
    expect(who.stdout).toMatch(/CapEff:\s+0000000000000000/);
    expect(who.stdout).toMatch(/NoNewPrivs:\s+1/);
    await driver.destroy(session.id);
  });

  it('kills a process over the memory limit and reports it', async () => {
    const session = { id: sid() };
    const sb = await driver.ensure(session, { memory_mib: 64 });
    const res = await driver.exec(sb, { script: 'x=$(head -c 300000000 /dev/zero | tr "\\0" a); echo survived' }, { timeoutMs: 30_000 });
    expect(res.stdout).not.toContain('survived');
    expect(res.oomKilled).toBe(true);
    // The sandbox is still usable afterwards.
    expect((await driver.exec(sb, ['echo', 'alive'])).stdout).toBe('alive\n');
    await driver.destroy(session.id);
  });

  it('bounds /tmp and the home directory below the memory limit: filling them fails the write, and the sandbox goes on', async () => {
    const session = { id: sid() };
    // tmpfs pages count against the memory limit: /tmp as large as the limit would leave no
    // memory to start any later command (not even the `rm` that would free it).
    const sb = await driver.ensure(session, { memory_mib: 128 });
    const full = await driver.exec(sb, { script: 'cat /dev/zero > /tmp/big; echo rc=$?; cat /dev/zero > ~/big; echo rc=$?; du -m /tmp/big ~/big' }, { timeoutMs: 30_000 });
    expect(full.exitCode).toBe(0);
    expect(full.stderr).toContain('No space left on device');
    expect(full.stdout).toBe('rc=1\nrc=1\n32\t/tmp/big\n8\t/home/agent/big\n');
    expect((await driver.exec(sb, ['echo', 'alive'])).stdout).toBe('alive\n');
    expect((await driver.exec(sb, { script: 'rm /tmp/big ~/big && echo freed' })).stdout).toBe('freed\n');
    await driver.destroy(session.id);
    // The default memory limit keeps the documented sizes.
    expect(scratchSizes(SANDBOX_DEFAULTS.memory_mib)).toEqual({ tmpMib: 256, homeMib: 64, shmMib: 64 });
    expect(scratchSizes(64)).toEqual({ tmpMib: 16, homeMib: 4, shmMib: 4 });
  });

  it('bounds /dev/shm below the memory limit: at the smallest limit, filling it fails the write and the container lives on', async () => {
    const session = { id: sid() };
    // Docker's default /dev/shm (64 MiB) is the whole of the smallest memory limit: filling it
    // would OOM-kill the sandbox, every process of the Session with it.
    const sb = await driver.ensure(session, { memory_mib: 64 });
    const startedAt = (await docker.getContainer(sb.ref).inspect()).State.StartedAt;
    const full = await driver.exec(sb, { script: 'cat /dev/zero > /dev/shm/big; echo rc=$?; du -m /dev/shm/big' }, { timeoutMs: 30_000 });
    expect(full).toMatchObject({ exitCode: 0, oomKilled: false, stdout: 'rc=1\n4\t/dev/shm/big\n' });
    expect(full.stderr).toContain('No space left on device');
    expect((await driver.exec(sb, { script: 'rm /dev/shm/big && echo freed' })).stdout).toBe('freed\n');
    // The container was never stopped (and restarted) on the way.
    const info = await docker.getContainer(sb.ref).inspect();
    expect(info.State.StartedAt).toBe(startedAt);
    expect(info.HostConfig.ShmSize).toBe(4 * 1024 * 1024);
    await driver.destroy(session.id);
  });

  it('enforces the pids limit', async () => {
    const session = { id: sid() };
    const sb = await driver.ensure(session, { pids_limit: 20 });
    const res = await driver.exec(sb, { script: 'for i in $(seq 1 40); do sleep 1 & done 2>&1; echo spawned' }, { timeoutMs: 20_000 });
    expect(res.stdout + res.stderr).toMatch(/Resource temporarily unavailable|retry: No child processes|fork/);
    const count = await driver.exec(sb, { script: 'ls /proc | grep -c "^[0-9]"' });
    expect(Number(count.stdout.trim())).toBeLessThanOrEqual(20);
    await driver.destroy(session.id);
  });

  it('a sandbox whose process limit is held by processes left running is restarted: the next command runs, the workspace kept', async () => {
    const session = { id: sid() };
    const sb = await driver.ensure(session, { pids_limit: 32 });
    await driver.exec(sb, { script: 'echo kept > /workspace/kept' });
    // Escapes the command's process group and takes every process the sandbox may have, for good.
    const bomb = await driver.exec(sb, { script: 'setsid bash -c "while true; do sleep 1000 & done" >/dev/null 2>&1 </dev/null & echo started' });
    expect(bomb.stdout).toBe('started\n');
    await expect.poll(async () => (await docker.getContainer(sb.ref).top()).Processes.length, { timeout: 20_000, interval: 100 }).toBeGreaterThanOrEqual(30);
    // Without a restart every later command fails to start ("setsid: fork: Resource temporarily unavailable").
    const res = await driver.exec(sb, { script: 'cat /workspace/kept' });
    expect(res).toMatchObject({ exitCode: 0, stdout: 'kept\n' });
    expect(res.stderr).toContain('process limit was exhausted');
    expect((await driver.exec(sb, ['echo', 'alive'])).stdout).toBe('alive\n');
    await driver.destroy(session.id);
  }, 60_000);

  it('a sandbox left a few processes short of its limit (too few for the engine to start a command) is restarted too', async () => {
    const session = { id: sid() };
    const sb = await driver.ensure(session, { pids_limit: 32 });
    await driver.exec(sb, { script: 'echo kept > /workspace/kept' });
    // More detached sleeps than the limit takes: the loop stops where forks fail, a few short of it.
    await driver.exec(sb, { script: 'for i in $(seq 1 40); do setsid sleep 1000 >/dev/null 2>&1 </dev/null & done; true' });
    await expect.poll(async () => (await docker.getContainer(sb.ref).top()).Processes.length, { timeout: 20_000, interval: 100 }).toBeGreaterThanOrEqual(24);
    const res = await driver.exec(sb, { script: 'cat /workspace/kept' });
    expect(res).toMatchObject({ exitCode: 0, stdout: 'kept\n' });
    expect((await driver.exec(sb, ['echo', 'alive'])).stdout).toBe('alive\n');
    await driver.destroy(session.id);
  }, 60_000);

  it('interrupt kills a sleep 600 and its whole process group within bounded time', async () => {
    const session = { id: sid() };
    const sb = await driver.ensure(session, {});
    const controller = new AbortController();
    const started = Date.now();
    setTimeout(() => controller.abort(), 300);
    const res = await driver.exec(sb, { script: 'sleep 600 & sleep 600' }, { signal: controller.signal });
    await expectKilledInBound(sb, res, started);
    await driver.destroy(session.id);
  });

  it('an interrupt that comes while the exec is being started still kills the command', async () => {
    const session = { id: sid() };
    const sb = await driver.ensure(session, {});
    // A first exec reads the container's OOM count: the next one goes straight to starting.
    await driver.exec(sb, ['true']);
    const controller = new AbortController();
    const started = Date.now();
    const running = driver.exec(sb, { script: 'sleep 600' }, { signal: controller.signal });
    // The exec is being created in the engine now (past its check of the signal, before it listens).
    controller.abort();
    await expectKilledInBound(sb, await running, started);
    await driver.destroy(session.id);
  });

  it('spawns a command with open stdio (the colocated harness) and kills its process group', async () => {
    const session = { id: sid() };
    const sb = await driver.ensure(session, {});
    const proc = await driver.spawn(sb, ['node', '-e', 'process.stdin.on("data", (d) => process.stdout.write("echo:" + d)); process.stdin.on("end", () => process.exit(7))']);
    const out: Buffer[] = [];
    proc.stdout.on('data', (c: Buffer) => out.push(c));
    proc.stdin.write('one\n');
    await waitUntil(() => Buffer.concat(out).toString().includes('echo:one'));
    proc.stdin.write('two\n');
    await waitUntil(() => Buffer.concat(out).toString().includes('echo:two'));
    proc.stdin.end();
    expect(await proc.wait()).toEqual({ exitCode: 7, killed: false });

    const sleeper = await driver.spawn(sb, { script: 'sleep 600 & sleep 600' });
    await new Promise((r) => setTimeout(r, 300));
    const started = Date.now();
    await sleeper.kill();
    expect(Date.now() - started).toBeLessThan(5_000);
    expect((await sleeper.wait()).killed).toBe(true);
    const ps = await driver.exec(sb, ['ps', '-eo', 'args']);
    expect(ps.stdout).not.toContain('sleep 600');
    await driver.destroy(session.id);
  });

  it('holds a command whose output nobody reads instead of buffering it, loses none of it, and kills it without the container', async () => {
    const warnings: string[] = [];
    const sink = new Writable({ write: (line: Buffer, _enc, done) => { warnings.push(line.toString()); done(); } });
    const driver = new DockerDriver({ runnerId, docker, logger: createLogger({ name: 'sandbox', level: 'warn', destination: sink }) });
    const session = { id: sid() };
    const sb = await driver.ensure(session, {});
    const total = 64 * 1024 * 1024;
    const flood = await driver.spawn(sb, { script: `head -c ${total} /dev/zero; echo flooded >&2` });
    let said = '';
    flood.stderr.on('data', (d: Buffer) => (said += d.toString()));
    // Nobody reads stdout: `head` ends up blocked writing its pipe (the kernel says so), having written some.
    const blocked = async (): Promise<boolean> => {
      const r = await driver.exec(sb, { script: 'for p in /proc/[0-9]*; do grep -qx head $p/comm 2>/dev/null && echo "$(cat $p/wchan) $(sed -n "s/^wchar: //p" $p/io)"; done; true' });
      const [wchan, written] = r.stdout.trim().split(' ');
      return /pipe_write/.test(wchan ?? '') && Number(written) >= 64 * 1024;
    };
    const until = Date.now() + 20_000;
    while (!(await blocked())) {
      if (Date.now() > until) throw new Error('head was never seen blocked on its pipe (its output was taken as it came)');
    }
    // …while the runner holds at most a frame or two of it.
    const held = flood.stdout as unknown as { readableLength: number; writableLength: number };
    expect(held.readableLength + held.writableLength).toBeLessThan(1024 * 1024);
    let got = 0;
    flood.stdout.on('data', (d: Buffer) => (got += d.length));
    expect(await flood.wait()).toEqual({ exitCode: 0, killed: false });
    await waitUntil(() => said.includes('flooded'));
    expect(got).toBe(total);

    // A command nobody reads, killed: its end is seen at once, the container is not killed to bound it.
    const endless = await driver.spawn(sb, { script: 'cat /dev/zero' });
    endless.stderr.resume();
    while (!/pipe_write/.test((await driver.exec(sb, { script: 'for p in /proc/[0-9]*; do grep -qx cat $p/comm 2>/dev/null && cat $p/wchan; done; true' })).stdout)) {
      if (Date.now() > until + 20_000) throw new Error('cat was never seen blocked on its pipe');
    }
    await endless.kill();
    expect((await endless.wait()).killed).toBe(true);
    expect(warnings.join('')).not.toContain('killing the sandbox container to bound a cancel');
    await driver.destroy(session.id);
  }, 90_000);

  it('a command the engine is slow to start still ends at its timeout or interrupt, and is killed when it does start', async () => {
    // The real engine, except that creating an exec waits for `release` while `stall` is set.
    let stall = false;
    let release: () => void = () => {};
    const released = new Promise<void>((resolve) => {
      release = resolve;
    });
    let stalled = 0;
    const created: string[][] = [];
    const wrap = (container: Docker.Container): Docker.Container =>
      new Proxy(container, {
        get(target, prop, receiver) {
          if (prop !== 'exec') return Reflect.get(target, prop, receiver) as unknown;
          return async (opts: Docker.ExecCreateOptions) => {
            created.push(opts.Cmd ?? []);
            if (stall) {
              stalled += 1;
              await released;
            }
            return target.exec(opts);
          };
        },
      });
    const engine = new Proxy(docker, {
      get(target, prop, receiver) {
        if (prop === 'createContainer') return async (opts: Docker.ContainerCreateOptions) => wrap(await target.createContainer(opts));
        if (prop === 'getContainer') return (id: string) => wrap(target.getContainer(id));
        return Reflect.get(target, prop, receiver) as unknown;
      },
    });
    const slow = new DockerDriver({ runnerId, docker: engine });
    const session = { id: sid() };
    const sb = await slow.ensure(session, {});
    // A first exec reads the container's OOM count: the next ones go straight to starting.
    expect((await slow.exec(sb, ['true'])).exitCode).toBe(0);
    stall = true;
    const timedOut = await slow.exec(sb, { script: 'sleep 600' }, { timeoutMs: 300 });
    expect(timedOut).toMatchObject({ exitCode: 137, timedOut: true, killed: false });
    const controller = new AbortController();
    const interrupted = slow.exec(sb, { script: 'sleep 600' }, { signal: controller.signal });
    await waitUntil(() => stalled === 2);
    controller.abort();
    expect(await interrupted).toMatchObject({ exitCode: 137, timedOut: false, killed: true });
    // The engine answers at last: the commands it then starts are killed, not left running.
    stall = false;
    release();
    const killers = (): number => created.filter((cmd) => cmd.includes('agentplane-kill')).length;
    await waitUntil(() => killers() === 2, 15_000);
    await expect.poll(async () => (await slow.exec(sb, ['ps', '-eo', 'args'])).stdout, { timeout: 15_000, interval: 100 }).not.toContain('sleep 600');
    await slow.destroy(session.id);
  });

  it('times out and caps output', async () => {
    const session = { id: sid() };
    const sb = await driver.ensure(session, {});
    const slow = await driver.exec(sb, ['sleep', '30'], { timeoutMs: 300 });
    expect(slow.timedOut).toBe(true);
    expect(slow.durationMs).toBeLessThan(5_000);
    const big = await driver.exec(sb, { script: 'head -c 3000000 /dev/zero | tr "\\0" x' }, { maxOutputBytes: 1000 });
    expect(big.truncated).toBe(true);
    expect(big.stdout.length).toBe(1000);
    // Past the cap but under the runaway bound: the command runs to its end.
    expect(big.exitCode).toBe(0);
    const stdin = await driver.exec(sb, ['wc', '-c'], { stdin: 'hello' });
    expect(stdin.stdout.trim()).toBe('5');
    await driver.destroy(session.id);
  });

  it('ends a command that writes without bound instead of letting it run to its timeout', async () => {
    const session = { id: sid() };
    const sb = await driver.ensure(session, {});
    const endless = await driver.exec(sb, ['cat', '/dev/zero'], { timeoutMs: 60_000 });
    expect(endless).toMatchObject({ exitCode: 137, truncated: true, timedOut: false, killed: false });
    expect(endless.stdout.length).toBe(EXEC_DEFAULTS.maxOutputBytes);
    expect(endless.stderr).toContain(`output truncated at ${EXEC_DEFAULTS.maxOutputBytes} bytes; the command was ended after writing more than ${runawayBytes(EXEC_DEFAULTS.maxOutputBytes)} bytes`);
    expect(endless.durationMs).toBeLessThan(20_000);
    expect((await driver.exec(sb, ['ps', '-eo', 'args'])).stdout).not.toContain('cat /dev/zero');
    await driver.destroy(session.id);
  }, 30_000);

  it('no one file grows past the Environment\'s disk size: the writer gets SIGXFSZ there', async () => {
    const session = { id: sid() };
    const sb = await driver.ensure(session, { disk_mib: 64 });
    const r = await driver.exec(sb, { script: 'head -c 100000000 /dev/zero > /workspace/big; echo rc=$? >&2; stat -c %s /workspace/big' });
    expect(r.stdout.trim()).toBe(String(64 * 1024 * 1024));
    expect(r.stderr).toContain('rc=153'); // 128 + SIGXFSZ
    // Files below the bound, in all above it, are written.
    const many = await driver.exec(sb, { script: 'head -c 40000000 /dev/zero > /workspace/a && head -c 40000000 /dev/zero > /workspace/b && echo ok' });
    expect([many.exitCode, many.stdout]).toEqual([0, 'ok\n']);
    await driver.destroy(session.id);
  });

  it('ends a running command once the host disk is under the reserve the runner keeps free, and says why', async () => {
    // A reserve above any disk's free space: every command that runs past the first look is ended.
    const guarded = new DockerDriver({ runnerId, docker, diskReserveMib: 2 ** 40 });
    const session = { id: sid() };
    const sb = await guarded.ensure(session, {});
    const quick = await guarded.exec(sb, { script: 'echo done' });
    expect([quick.exitCode, quick.stdout]).toEqual([0, 'done\n']);
    const r = await guarded.exec(sb, { script: 'sleep 60' }, { timeoutMs: 50_000 });
    expect([r.exitCode, r.timedOut, r.killed]).toEqual([137, false, false]);
    expect(r.stderr).toMatch(/the command was ended: the runner's disk has \d+ MiB free, under the \d+ MiB it keeps free/);
    expect(r.durationMs).toBeLessThan(30_000);
    expect((await guarded.exec(sb, ['ps', '-eo', 'args'])).stdout).not.toContain('sleep 60');
    await guarded.destroy(session.id);
  }, 60_000);

  it('materialises file and repository resources once, owned by the sandbox user', async () => {
    const session = { id: sid() };
    const sb = await driver.ensure(session, {});
    const tar = createTar([
      { type: 'dir', path: 'src' },
      { type: 'file', path: 'src/main.ts', data: Buffer.from('console.log(1)\n'), uid: 0, gid: 0 },
      { type: 'file', path: 'README.md', data: Buffer.from('# repo\n') },
    ]);
    const resources = [
      { type: 'repository' as const, id: 'res_1', mount_path: 'repo', snapshot: { kind: 'tar' as const, data: tar } },
      { type: 'file' as const, id: 'res_2', mount_path: 'data/input.csv', content: Buffer.from('a,b\n1,2\n') },
    ];
    const first = await materializeResources(driver, sb, resources);
    expect(first).toMatchObject({ skipped: false, files: 3 });
    const ls = await driver.exec(sb, { script: 'stat -c "%U %n" repo/src/main.ts data/input.csv; cat repo/README.md' });
    expect(ls.stdout).toBe('agent repo/src/main.ts\nagent data/input.csv\n# repo\n');
    const second = await materializeResources(driver, sb, resources);
    expect(second.skipped).toBe(true);
    await driver.destroy(session.id);
  });

  it('refuses a resource path with a NUL (the archive would read `..\\0` as `..`, the sandbox root) and keeps the root', async () => {
    const session = { id: sid() };
    const sb = await driver.ensure(session, {});
    for (const mount_path of ['/..\0', 'x\0y']) {
      await expect(materializeResources(driver, sb, [{ type: 'file' as const, id: 'res_nul', mount_path, content: Buffer.from('x') }])).rejects.toMatchObject({ name: 'SandboxError', reason: 'invalid_path' });
    }
    const ls = await driver.exec(sb, { script: 'ls /bin/sh /etc/passwd && ls -A /workspace' });
    expect([ls.exitCode, ls.stdout]).toEqual([0, '/bin/sh\n/etc/passwd\n']);
    await driver.destroy(session.id);
  });

  it('reaps orphans labelled for this runner and keeps the rest', async () => {
    const other = new DockerDriver({ runnerId: `${runnerId}-reap`, docker });
    const keep = { id: sid() };
    const orphan = { id: sid() };
    await other.ensure(keep, {});
    await other.ensure(orphan, {});
    // Logged the way the daemon logs (its logger names the runner): each key once per line.
    const lines: string[] = [];
    const logger = createLogger({ name: 'runner', level: 'info', destination: { write: (line: string) => void lines.push(line) } }).child({ runner: runnerId });
    const reaper = new DockerDriver({ runnerId, docker, logger });
    const reaped = await reaper.reapOrphans(`${runnerId}-reap`, [keep.id]);
    expect(reaped).toEqual([orphan.id]);
    const line = lines.find((l) => l.includes('reaped orphan sandboxes')) ?? '';
    expect(line.match(/"runner":/g)).toHaveLength(1);
    expect(JSON.parse(line)).toMatchObject({ runner: runnerId, sandboxes_of: `${runnerId}-reap`, sessions: [orphan.id] });
    const left = await docker.listContainers({
      all: true,
      filters: JSON.stringify({ label: [`${SANDBOX_LABELS.runner}=${runnerId}-reap`] }),
    });
    expect(left.map((c) => c.Labels[SANDBOX_LABELS.session])).toEqual([keep.id]);
    await other.reapOrphans(`${runnerId}-reap`, []);
  });

  it('bounds start: a start past the bound fails typed and leaves no container behind', async () => {
    const hasty = new DockerDriver({ runnerId, docker, startTimeoutMs: 1 });
    const session = { id: sid() };
    await expect(hasty.ensure(session, {})).rejects.toMatchObject({ name: 'SandboxError', reason: 'start_timeout' });
    // The creation that was still in flight is removed once it settles.
    const filters = JSON.stringify({ label: [`${SANDBOX_LABELS.session}=${session.id}`] });
    const list = (): Promise<Docker.ContainerInfo[]> => docker.listContainers({ all: true, filters });
    // Under load the late creation can take seconds: wait until it has appeared and gone again.
    let seen = false;
    let left = await list();
    for (let i = 0; i < 300 && !(seen && left.length === 0); i++) {
      seen ||= left.length > 0;
      await new Promise((r) => setTimeout(r, 100));
      left = await list();
    }
    expect(left).toEqual([]);
    await hasty.destroy(session.id);
  });

  it('accounts compute per sandbox', async () => {
    const session = { id: sid() };
    const sb = await driver.ensure(session, {});
    await driver.exec(sb, { script: 'i=0; while [ $i -lt 20000 ]; do i=$((i+1)); done' });
    const usage = await driver.usage(sb);
    expect(usage?.cpu_nanos).toBeGreaterThan(1_000_000);
    expect(usage?.memory_peak_bytes).toBeGreaterThan(0);
    await driver.destroy(session.id);
  });

  it('labels its tier canaries managed and its own, so that a runner killed during one leaves nothing unreaped', async () => {
    const created: Array<Record<string, string> | undefined> = [];
    class Recording extends Docker {
      override createContainer(options: Docker.ContainerCreateOptions): Promise<Docker.Container> {
        created.push(options.Labels);
        return super.createContainer(options);
      }
    }
    const probing = new DockerDriver({ runnerId, docker: new Recording(), tiers: ['container'] });
    expect((await probing.verifyTiers()).find((v) => v.tier === 'container')).toMatchObject({ ok: true });
    expect(created).toHaveLength(1);
    expect(created[0]).toMatchObject({ [SANDBOX_LABELS.managed]: 'true', [SANDBOX_LABELS.runner]: runnerId, 'dev.agentplane.canary': 'true' });
    expect(created[0]).not.toHaveProperty(SANDBOX_LABELS.session);
  });

  it('reports only assurances it implements and satisfies container Environments once a canary ran', async () => {
    const verdicts = await driver.verifyTiers();
    expect(verdicts.find((v) => v.tier === 'container')).toMatchObject({ ok: true, runtime: undefined });
    expect(driver.capabilities().tiers).toContain('container');
    expect(driver.capabilities()).toMatchObject({ network_modes: ['none', 'allowlist'], session_sandbox: true });
    expect(driverSatisfies(driver, { tier: 'container', network_mode: 'none' })).toBe(true);
    expect(driverSatisfies(driver, { tier: 'container', network_mode: 'allowlist' })).toBe(true);
    expect(driverSatisfies(driver, { tier: 'container', network_mode: 'host' })).toBe(false);
    expect(assuranceFlags(driver.assurances())).toEqual({
      network_isolation: true, bounded_start: true, bounded_cancel: true, teardown: true, compute_accounting: true,
    });
  });
});

/** An engine that refuses to remove the named containers (a 500, not a 404 or 409) and records every removal. */
function refusingEngine(containers: Array<{ id: string; session: string }>, refuse: Set<string>): { docker: Docker; removed: string[] } {
  const removed: string[] = [];
  const labels = (session: string): Record<string, string> => ({ [SANDBOX_LABELS.managed]: 'true', [SANDBOX_LABELS.session]: session });
  const engine = {
    listContainers: async () => containers.map((c) => ({ Id: c.id, Labels: labels(c.session) })),
    listVolumes: async () => ({ Volumes: [] }),
    getContainer: (id: string) => ({
      remove: async () => {
        if (refuse.has(id)) throw Object.assign(new Error('engine answered 500'), { statusCode: 500 });
        removed.push(id);
      },
    }),
    getVolume: (name: string) => ({
      remove: async () => {
        removed.push(name);
      },
    }),
  };
  return { docker: engine as unknown as Docker, removed };
}

describe('docker sandbox driver when the engine fails', () => {
  it('reaps every other container when one cannot be removed', async () => {
    const containers = [{ id: 'c1', session: 'sess_1' }, { id: 'c2', session: 'sess_2' }, { id: 'c3', session: 'sess_3' }];
    const { docker: engine, removed } = refusingEngine(containers, new Set(['c2']));
    const failing = new DockerDriver({ runnerId, docker: engine, defaultImage: 'unused' });
    expect(await failing.reapOrphans(runnerId, [])).toEqual(['sess_1', 'sess_3']);
    expect(removed).toEqual(['c1', 'c3']);
  });

  it('removes the workspace volume even when removing the container fails, then reports the failure', async () => {
    const refuse = new Set<string>();
    const { docker: engine, removed } = refusingEngine([], refuse);
    const failing = new DockerDriver({ runnerId, docker: engine, defaultImage: 'unused' });
    refuse.add(failing.containerName('sess_1'));
    await expect(failing.destroy('sess_1')).rejects.toThrow('engine answered 500');
    expect(removed).toEqual([failing.volumeName('sess_1')]);
  });
});
