import { spawn, type ChildProcess } from 'node:child_process';
import { existsSync, mkdirSync, mkdtempSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, afterEach, describe, expect, it } from 'vitest';
import {
  acquireDaemonLock, claimDrainRequest, clearDrainRequests, DaemonRunningError, drainRequestedAt, drainRequestPath, lockDir,
  processLive, processStart, selfIdentity, type DaemonLock, type ProcessIdentity,
} from './lock.js';

const dirs: string[] = [];
const tmp = (): string => {
  const d = mkdtempSync(join(tmpdir(), 'runner-lock-'));
  dirs.push(d);
  return d;
};
const children: ChildProcess[] = [];
const locks: DaemonLock[] = [];

/** An idle process standing in for a daemon; resolves once it runs. */
async function idleProcess(): Promise<{ child: ChildProcess; id: ProcessIdentity }> {
  const child = spawn(process.execPath, ['-e', "process.stdout.write('ready\\n'); setInterval(() => {}, 1000)"], { stdio: ['ignore', 'pipe', 'ignore'] });
  children.push(child);
  await new Promise((r) => child.stdout?.once('data', r));
  const pid = child.pid ?? 0;
  return { child, id: { pid, start: processStart(pid) } };
}

/** kill -9, resolved once the process is gone (reaped, not a zombie). */
const kill9 = (child: ChildProcess): Promise<void> => new Promise((r) => {
  child.once('exit', () => r());
  child.kill('SIGKILL');
});

afterEach(() => {
  for (const l of locks.splice(0)) l.release();
});
afterAll(() => {
  for (const c of children) if (c.exitCode === null && c.signalCode === null) c.kill('SIGKILL');
  for (const d of dirs) rmSync(d, { recursive: true, force: true });
});

describe('processLive', () => {
  it('knows this process, and tells a gone or reused pid apart', async () => {
    expect(processLive(selfIdentity())).toBe(true);
    const { child, id } = await idleProcess();
    expect(processLive(id)).toBe(true);
    if (id.start !== null) expect(processLive({ pid: id.pid, start: 'another-start' })).toBe(false);
    await kill9(child);
    expect(processLive(id)).toBe(false);
    expect(processLive({ pid: 0, start: null })).toBe(false);
  });
});

describe('the daemon lock', () => {
  it('is held by one process: a second is refused while the first lives, and gets it once released', async () => {
    const dir = tmp();
    const { id } = await idleProcess();
    const first = acquireDaemonLock(dir, id);
    locks.push(first);
    expect(existsSync(first.path)).toBe(true);
    let refused: unknown;
    try {
      locks.push(acquireDaemonLock(dir, selfIdentity()));
    } catch (err) {
      refused = err;
    }
    expect(refused).toBeInstanceOf(DaemonRunningError);
    expect((refused as DaemonRunningError).holder.pid).toBe(id.pid);
    expect((refused as DaemonRunningError).message).toContain(`pid ${id.pid}`);
    // The refused contender leaves nothing behind.
    expect(readdirSync(lockDir(dir))).toEqual([first.path.split('/').pop()]);
    first.release();
    expect(existsSync(first.path)).toBe(false);
    const second = acquireDaemonLock(dir, selfIdentity());
    locks.push(second);
    expect(readdirSync(lockDir(dir))).toEqual([second.path.split('/').pop()]);
  });

  it('a holder killed with kill -9 leaves a stale entry that the next start removes', async () => {
    const dir = tmp();
    const { child, id } = await idleProcess();
    const held = acquireDaemonLock(dir, id);
    locks.push(held);
    await kill9(child);
    expect(existsSync(held.path)).toBe(true);
    const next = acquireDaemonLock(dir, selfIdentity());
    locks.push(next);
    expect(existsSync(held.path)).toBe(false);
    expect(readdirSync(lockDir(dir))).toHaveLength(1);
  });

  it('an entry whose pid now belongs to another process is stale', async () => {
    const dir = tmp();
    const { id } = await idleProcess();
    if (id.start === null) return; // no start times on this OS: a live pid is taken for the holder
    mkdirSync(lockDir(dir), { recursive: true });
    // What a daemon long gone left, its pid since reused by the idle process.
    const stale = join(lockDir(dir), `${id.pid}-1.json`);
    writeFileSync(stale, '{}');
    locks.push(acquireDaemonLock(dir, selfIdentity()));
    expect(existsSync(stale)).toBe(false);
  });

  it('a contender that has only created its entry blocks a start (of two racing, none is let in twice)', async () => {
    const dir = tmp();
    const { id } = await idleProcess();
    mkdirSync(lockDir(dir), { recursive: true });
    // Written but still empty: the name alone says whose it is.
    writeFileSync(join(lockDir(dir), `${id.pid}${id.start === null ? '' : `-${id.start}`}.json`), '');
    expect(() => acquireDaemonLock(dir, selfIdentity())).toThrow(DaemonRunningError);
  });

  it('is released when the process exits', async () => {
    const dir = tmp();
    const { child, id } = await idleProcess();
    const held = acquireDaemonLock(dir, id);
    locks.push(held);
    await kill9(child);
    // This process takes it; release() runs on exit too (registered once, removed when released).
    const mine = acquireDaemonLock(dir, selfIdentity());
    expect(process.listeners('exit')).toContain(mine.release);
    mine.release();
    expect(process.listeners('exit')).not.toContain(mine.release);
    expect(existsSync(mine.path)).toBe(false);
    expect(existsSync(held.path)).toBe(false);
  });
});

describe('drain requests', () => {
  it('exactly one request per daemon is recorded; a starting daemon drops those of earlier lives', () => {
    const dir = tmp();
    expect(drainRequestedAt(dir, 4242)).toBeNull();
    expect(claimDrainRequest(dir, 4242)).toBe(true);
    expect(claimDrainRequest(dir, 4242)).toBe(false);
    expect(Date.parse(drainRequestedAt(dir, 4242) ?? '')).not.toBeNaN();
    expect(claimDrainRequest(dir, 4243)).toBe(true);
    writeFileSync(join(dir, 'runner.json'), '{}');
    clearDrainRequests(dir);
    expect(existsSync(drainRequestPath(dir, 4242))).toBe(false);
    expect(existsSync(drainRequestPath(dir, 4243))).toBe(false);
    expect(existsSync(join(dir, 'runner.json'))).toBe(true);
    expect(claimDrainRequest(dir, 4242)).toBe(true);
  });
});
