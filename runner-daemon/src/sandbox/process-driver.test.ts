import { randomBytes } from 'node:crypto';
import { execFileSync } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import Docker from 'dockerode';
import { afterAll, describe, expect, it } from 'vitest';
import { dockerAvailable } from '@agentplane/sandbox';
import { bashTool, runTool, writeTool, readTool } from '../harness/tools/builtin.js';
import { ProcessDriver } from './process-driver.js';
import { runawayBytes } from './output.js';
import { selectDriver } from './select.js';
import { driverSatisfies } from './types.js';

const dataDir = mkdtempSync(join(tmpdir(), 'agentplane-process-'));
const bogusDocker = new Docker({ socketPath: join(dataDir, 'no-docker.sock') });

afterAll(() => {
  rmSync(dataDir, { recursive: true, force: true });
});

describe('process driver (no Docker)', () => {
  it('is selected when Docker is unavailable and is never eligible for container Environments', async () => {
    expect(await dockerAvailable(bogusDocker)).toBe(false);
    const driver = await selectDriver({ runnerId: 'r-proc', dataDir, docker: bogusDocker });
    expect(driver).toBeInstanceOf(ProcessDriver);
    expect(driver!.capabilities()).toMatchObject({ tiers: ['process'], launch_kinds: ['trusted'], unisolated: true, network_modes: ['host'] });
    expect(driver!.assurances()).not.toContain('network_isolation');
    expect(driverSatisfies(driver!, { tier: 'container' })).toBe(false);
    expect(driverSatisfies(driver!, {})).toBe(false); // container is the default requirement
    expect(driverSatisfies(driver!, { tier: 'process' })).toBe(true);
    expect(driverSatisfies(driver!, { tier: 'process', network_mode: 'none' })).toBe(false);
    // No egress proxy without isolation to put it in front of.
    expect(driverSatisfies(driver!, { tier: 'process', network_mode: 'allowlist' })).toBe(false);
    expect(await selectDriver({ runnerId: 'r-proc', dataDir, docker: bogusDocker, allowProcess: false })).toBeUndefined();
  });

  it('runs tools in a per-session workspace, keeps files between Runs, and removes it on destroy', async () => {
    const driver = new ProcessDriver({ runnerId: 'r-proc', dataDir });
    const session = { id: `sess_${randomBytes(6).toString('hex')}` };
    const sandbox = await driver.ensure(session, {});
    expect(sandbox.workspace.startsWith(dataDir)).toBe(true);
    const ctx = { driver, sandbox };
    expect((await runTool(writeTool, ctx, { path: 'a/b.txt', content: 'hello\n' })).is_error).toBe(false);
    const again = await driver.ensure(session, {});
    expect(again.reused).toBe(true);
    expect((await runTool(readTool, { driver, sandbox: again }, { path: 'a/b.txt' })).content).toBe('     1\thello\n');
    const pwd = await runTool(bashTool, ctx, { command: 'pwd' });
    expect(pwd.content).toBe(`${sandbox.workspace}\n[exit code 0]`);
    await driver.destroy(session.id);
    expect(() => execFileSync('ls', [sandbox.workspace], { stdio: 'pipe' })).toThrow();
  });

  it('interrupt and timeout kill the whole process group', async () => {
    const driver = new ProcessDriver({ runnerId: 'r-proc', dataDir });
    const session = { id: `sess_${randomBytes(6).toString('hex')}` };
    const sandbox = await driver.ensure(session, {});
    const marker = `agentplane-test-${randomBytes(4).toString('hex')}`;
    const controller = new AbortController();
    const started = Date.now();
    setTimeout(() => controller.abort(), 200);
    const res = await driver.exec(sandbox, { script: `exec -a ${marker} sleep 600 & exec -a ${marker} sleep 600` }, { signal: controller.signal });
    expect(res.killed).toBe(true);
    expect(Date.now() - started).toBeLessThan(2_000);
    await new Promise((r) => setTimeout(r, 100));
    const ps = execFileSync('ps', ['-eo', 'args'], { encoding: 'utf8' });
    expect(ps).not.toContain(marker);
    const slow = await driver.exec(sandbox, ['sleep', '30'], { timeoutMs: 200 });
    expect(slow.timedOut).toBe(true);
    expect(slow.exitCode).toBe(137);
    expect(await driver.reapOrphans('r-proc', [])).toContain(session.id);
  });

  it('a descendant that left the process group and holds stdout open does not hold the command', async () => {
    const driver = new ProcessDriver({ runnerId: 'r-proc', dataDir });
    const session = { id: `sess_${randomBytes(6).toString('hex')}` };
    const sandbox = await driver.ensure(session, {});
    const tag = randomBytes(4).toString('hex');
    const escape = (marker: string): string => `setsid bash -c 'exec -a ${marker} sleep 30' & echo x`;
    const running = (marker: string): boolean => execFileSync('ps', ['-eo', 'args'], { encoding: 'utf8' }).includes(marker);

    // The command itself ends at once: its result comes then, not when the escaped sleep ends.
    const done = await driver.exec(sandbox, { script: escape(`agentplane-left-${tag}`) }, { timeoutMs: 20_000 });
    expect(done).toMatchObject({ exitCode: 0, stdout: 'x\n', timedOut: false });
    expect(done.durationMs).toBeLessThan(5_000);

    // Timed out: it reports the timeout within bound, and what escaped its group is killed too.
    const slow = await driver.exec(sandbox, { script: `${escape(`agentplane-timed-${tag}`)}; sleep 30` }, { timeoutMs: 1_000 });
    expect(slow).toMatchObject({ exitCode: 137, stdout: 'x\n', timedOut: true });
    expect(slow.durationMs).toBeLessThan(5_000);
    await expect.poll(() => running(`agentplane-timed-${tag}`), { timeout: 3_000 }).toBe(false);
    // A command that ended by itself leaves what it started to the session (removed with it).
    expect(running(`agentplane-left-${tag}`)).toBe(true);
    await driver.destroy(session.id);
    await expect.poll(() => running(`agentplane-left-${tag}`), { timeout: 3_000 }).toBe(false);
  }, 15_000);

  it('ends a command that writes without bound instead of letting it run to its timeout', async () => {
    const driver = new ProcessDriver({ runnerId: 'r-proc', dataDir });
    const sandbox = await driver.ensure({ id: `sess_${randomBytes(6).toString('hex')}` }, {});
    const endless = await driver.exec(sandbox, ['cat', '/dev/zero'], { timeoutMs: 60_000, maxOutputBytes: 1000 });
    expect(endless).toMatchObject({ exitCode: 137, truncated: true, timedOut: false, killed: false });
    expect(endless.stdout.length).toBe(1000);
    expect(endless.stderr).toContain(`the command was ended after writing more than ${runawayBytes(1000)} bytes`);
    // A chatty command under the bound runs to its end, its output capped.
    const chatty = await driver.exec(sandbox, { script: 'head -c 3000000 /dev/zero | tr "\\0" x; echo done >&2' }, { maxOutputBytes: 1000 });
    expect(chatty).toMatchObject({ exitCode: 0, truncated: true, stderr: 'done\n' });
  }, 30_000);

  it('spawns a command with open stdio and kills its process group', async () => {
    const driver = new ProcessDriver({ runnerId: 'r-proc', dataDir });
    const sandbox = await driver.ensure({ id: `sess_${randomBytes(6).toString('hex')}` }, {});
    const cat = await driver.spawn(sandbox, ['bash', '-c', 'while read -r l; do echo "got:$l"; done; exit 4']);
    const out: Buffer[] = [];
    cat.stdout.on('data', (c: Buffer) => out.push(c));
    cat.stdin.end('a\nb\n');
    expect(await cat.wait()).toEqual({ exitCode: 4, killed: false });
    expect(Buffer.concat(out).toString()).toBe('got:a\ngot:b\n');
    const marker = `agentplane-spawn-${randomBytes(4).toString('hex')}`;
    const sleeper = await driver.spawn(sandbox, { script: `exec -a ${marker} sleep 600 & exec -a ${marker} sleep 600` });
    await new Promise((r) => setTimeout(r, 100));
    await sleeper.kill();
    expect(await sleeper.wait()).toEqual({ exitCode: 137, killed: true });
    await new Promise((r) => setTimeout(r, 100));
    expect(execFileSync('ps', ['-eo', 'args'], { encoding: 'utf8' })).not.toContain(marker);
  });

  it('a spawned command is killed at once even when what it started left its group holding stdout', async () => {
    const driver = new ProcessDriver({ runnerId: 'r-proc', dataDir });
    const sandbox = await driver.ensure({ id: `sess_${randomBytes(6).toString('hex')}` }, {});
    const marker = `agentplane-spawn-left-${randomBytes(4).toString('hex')}`;
    const proc = await driver.spawn(sandbox, { script: `setsid bash -c 'exec -a ${marker} sleep 30' & echo started; sleep 30` });
    const running = () => execFileSync('ps', ['-eo', 'args'], { encoding: 'utf8' }).includes(marker);
    // Out of the group before the kill (the echo may come first).
    await expect.poll(running, { timeout: 3_000 }).toBe(true);
    const started = Date.now();
    await proc.kill();
    expect(await proc.wait()).toEqual({ exitCode: 137, killed: true });
    expect(Date.now() - started).toBeLessThan(5_000);
    await expect.poll(running, { timeout: 3_000 }).toBe(false);
  }, 15_000);
});
