import { randomBytes } from 'node:crypto';
import { createServer, type Server, type Socket } from 'node:net';
import { PassThrough } from 'node:stream';
import Docker from 'dockerode';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { DockerDriver } from '../sandbox/docker-driver.js';
import { ensureSandboxImage } from '../sandbox/image.js';
import type { SandboxProcess } from '../sandbox/types.js';
import { bridgeForwarder, FORWARDER_MAX_CONNECTIONS, FORWARDER_MAX_LINE_BYTES, FORWARDER_SOURCE } from './forwarder.js';

/** A loopback TCP server standing in for the model endpoint; keeps every connection open. */
async function endpoint(): Promise<{ server: Server; port: number; sockets: Socket[] }> {
  const sockets: Socket[] = [];
  const server = createServer((s) => {
    sockets.push(s);
    s.on('error', () => undefined);
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  return { server, port: (server.address() as { port: number }).port, sockets };
}

function close(e: { server: Server; sockets: Socket[] }): void {
  for (const s of e.sockets) s.destroy();
  e.server.close();
}

/** A forwarder process whose stdout the test writes (what the sandbox end, or anything in the sandbox, sends). */
function fakeForwarder(): { proc: SandboxProcess; out: PassThrough; toSandbox: string[]; killed: () => boolean } {
  const stdout = new PassThrough();
  const stdin = new PassThrough();
  const toSandbox: string[] = [];
  stdin.on('data', (d: Buffer) => toSandbox.push(...d.toString('utf8').split('\n').filter(Boolean)));
  let exit!: (r: { exitCode: number; killed: boolean }) => void;
  const exited = new Promise<{ exitCode: number; killed: boolean }>((r) => (exit = r));
  let killed = false;
  const proc: SandboxProcess = {
    stdin, stdout, stderr: new PassThrough(),
    wait: () => exited,
    kill: async () => {
      killed = true;
      exit({ exitCode: 137, killed: true });
    },
  };
  return { proc, out: stdout, toSandbox, killed: () => killed };
}

describe('the model forwarder bridge (runner end)', () => {
  it('ignores lines that are not the protocol, and refuses a connection id already in use', async () => {
    const ep = await endpoint();
    const f = fakeForwarder();
    const listening = bridgeForwarder(f.proc, ep.port);
    for (const line of ['null', '7', '"x"', '[]', '{"t":"data","c":1,"d":5}', '{"t":"open","c":"1"}', '{"t":"bogus"}', 'not json']) f.out.write(`${line}\n`);
    f.out.write('{"t":"listening","port":4100}\n');
    expect(await listening).toBe(4100);
    f.out.write('{"t":"open","c":1}\n{"t":"open","c":1}\n');
    await expect.poll(() => f.toSandbox).toContainEqual('{"t":"end","c":1}');
    await expect.poll(() => ep.sockets.length).toBe(1);
    expect(f.killed()).toBe(false);
    close(ep);
  });

  it('stops the forwarder and reports it when a line passes the bound (before the start: the start fails)', async () => {
    const ep = await endpoint();
    const before = fakeForwarder();
    const starting = bridgeForwarder(before.proc, ep.port);
    before.out.write(Buffer.alloc(FORWARDER_MAX_LINE_BYTES + 1, 'a'));
    await expect(starting).rejects.toThrow(`the model forwarder wrote a line longer than ${FORWARDER_MAX_LINE_BYTES} bytes`);
    expect(before.killed()).toBe(true);

    const after = fakeForwarder();
    const failures: Error[] = [];
    const failed = new Promise<void>((resolve) => {
      void bridgeForwarder(after.proc, ep.port, {
        onFailure: (err) => {
          failures.push(err);
          resolve();
        },
      });
    });
    after.out.write('{"t":"listening","port":4100}\n{"t":"open","c":1}\n');
    await expect.poll(() => ep.sockets.length).toBe(1);
    for (let i = 0; i < 5; i++) after.out.write(Buffer.alloc(1024 * 1024, 'a'));
    await failed;
    expect(failures.map((e) => e.message)).toEqual([expect.stringContaining(`longer than ${FORWARDER_MAX_LINE_BYTES} bytes`)]);
    expect(after.killed()).toBe(true);
    // Its connections to the endpoint are gone with it.
    await expect.poll(() => ep.sockets.every((s) => s.readableEnded || s.destroyed)).toBe(true);
    close(ep);
  });
});

/**
 * The forwarder's stdout is writable from anywhere in the sandbox (/proc/<pid>/fd/1), and each
 * `open` it sends makes the runner connect on its own loopback.
 */
const runnerId = `rtest-${randomBytes(4).toString('hex')}`;
const docker = new Docker();
const driver = new DockerDriver({ runnerId, docker });

describe('the model forwarder with a sandbox that abuses it', () => {
  beforeAll(async () => {
    await ensureSandboxImage({ docker });
  }, 180_000);
  afterAll(async () => {
    await driver.reapOrphans(runnerId, []);
  });

  it('carries a connection\'s bytes both ways', async () => {
    const echo = createServer((s) => s.pipe(s));
    await new Promise<void>((resolve) => echo.listen(0, '127.0.0.1', resolve));
    const session = { id: `sess_${randomBytes(8).toString('hex')}` };
    const sb = await driver.ensure(session, {});
    const fwd = await driver.spawn(sb, ['node', '-e', FORWARDER_SOURCE], { env: { AGENTPLANE_MODEL_PORT: '41000' } });
    try {
      expect(await bridgeForwarder(fwd, (echo.address() as { port: number }).port)).toBe(41000);
      // 2 MiB through the echo endpoint and back: many chunks, lines split across reads on both ends.
      const client = `
const net = require('node:net');
const crypto = require('node:crypto');
const data = crypto.randomBytes(2 * 1024 * 1024);
const s = net.connect(41000, '127.0.0.1', () => s.write(data));
const got = [];
let n = 0;
s.on('data', (d) => { got.push(d); n += d.length; if (n >= data.length) { process.stdout.write(Buffer.concat(got).equals(data) ? 'same' : 'different'); process.exit(0); } });`;
      const res = await driver.exec(sb, ['node', '-e', client], { timeoutMs: 30_000 });
      expect(res.stdout).toBe('same');
    } finally {
      await fwd.kill().catch(() => undefined);
      echo.close();
      await driver.destroy(session.id);
    }
  }, 60_000);

  it('a line without end stops the forwarder and is reported; the runner holds at most the bound', async () => {
    const ep = await endpoint();
    const session = { id: `sess_${randomBytes(8).toString('hex')}` };
    const sb = await driver.ensure(session, {});
    const fwd = await driver.spawn(sb, ['node', '-e', FORWARDER_SOURCE], { env: { AGENTPLANE_MODEL_PORT: '41000' } });
    try {
      let reported: Error | undefined;
      let started!: Promise<number>;
      const failed = new Promise<void>((resolve) => {
        started = bridgeForwarder(fwd, ep.port, {
          onFailure: (err) => {
            reported = err;
            resolve();
          },
        });
      });
      // The flood goes in once the forwarder has started: before, an over-long line fails the
      // start itself (its promise rejects), not a running forwarder (onFailure).
      expect(await started).toBe(41000);
      const before = process.memoryUsage().rss;
      let peak = before;
      const sample = setInterval(() => (peak = Math.max(peak, process.memoryUsage().rss)), 25);
      // 64 MiB without a newline (16 times the bound) into the forwarder's stdout.
      const script = `pid=$(ps -eo pid,args | awk '$2=="node" && $3=="-e" {print $1}' | head -1); head -c 64M /dev/zero | tr '\\0' a > /proc/$pid/fd/1`;
      const attack = driver.exec(sb, { script }, { timeoutMs: 60_000 }).catch(() => undefined);
      try {
        await failed;
      } finally {
        clearInterval(sample);
      }
      expect(reported?.message).toContain(`the model forwarder wrote a line longer than ${FORWARDER_MAX_LINE_BYTES} bytes`);
      // The in-sandbox forwarder is gone.
      expect((await fwd.wait()).killed).toBe(true);
      await attack;
      expect(peak - before).toBeLessThan(128 * 1024 * 1024);
    } finally {
      await fwd.kill().catch(() => undefined);
      close(ep);
      await driver.destroy(session.id);
    }
  }, 60_000);

  it(`carries at most ${FORWARDER_MAX_CONNECTIONS} connections at once and refuses the rest`, async () => {
    const ep = await endpoint();
    const session = { id: `sess_${randomBytes(8).toString('hex')}` };
    const sb = await driver.ensure(session, {});
    const fwd = await driver.spawn(sb, ['node', '-e', FORWARDER_SOURCE], { env: { AGENTPLANE_MODEL_PORT: '41000' } });
    try {
      expect(await bridgeForwarder(fwd, ep.port)).toBe(41000);
      const extra = 36;
      const total = FORWARDER_MAX_CONNECTIONS + extra;
      // Opens `total` connections and holds them; exits once the refused ones are closed.
      const client = `
const net = require('node:net');
let closed = 0;
for (let i = 0; i < ${total}; i++) {
  const s = net.connect(41000, '127.0.0.1');
  s.on('error', () => {});
  s.on('close', () => { if (++closed === ${extra}) { process.stdout.write('closed=' + closed); process.exit(0); } });
}`;
      const res = await driver.exec(sb, ['node', '-e', client], { timeoutMs: 30_000 });
      expect(res.stdout).toBe(`closed=${extra}`);
      await expect.poll(() => ep.sockets.length).toBe(FORWARDER_MAX_CONNECTIONS);
    } finally {
      await fwd.kill().catch(() => undefined);
      close(ep);
      await driver.destroy(session.id);
    }
  }, 60_000);
});
