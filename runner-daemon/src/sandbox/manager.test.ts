import { randomBytes } from 'node:crypto';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import Docker from 'dockerode';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { DockerDriver } from './docker-driver.js';
import { ensureSandboxImage } from './image.js';
import { SandboxManager } from './manager.js';
import { ProcessDriver } from './process-driver.js';

const runnerId = `mtest-${randomBytes(4).toString('hex')}`;
const docker = new Docker();
const driver = new DockerDriver({ runnerId, docker });
const dataDir = mkdtempSync(join(tmpdir(), 'agentplane-manager-'));

beforeAll(async () => {
  await ensureSandboxImage({ docker });
}, 120_000);

afterAll(async () => {
  await driver.reapOrphans(runnerId, []);
  rmSync(dataDir, { recursive: true, force: true });
});

describe('sandbox manager', () => {
  it('prepares with resources, suspends when idle, resumes with the workspace, expires, stops it on lease loss and removes it when the Session ends', async () => {
    let clock = 1_000_000;
    const manager = new SandboxManager({ driver, runnerId, idleSuspendMs: 60_000, idleExpireMs: 600_000, sweepIntervalMs: 0, now: () => clock });
    await manager.start();
    const session = { id: `sess_${randomBytes(8).toString('hex')}` };
    const resources = [{ type: 'file' as const, id: 'file_1', mount_path: 'input/data.txt', content: Buffer.from('42\n') }];
    const { sandbox, materialized } = await manager.prepare(session, {}, resources);
    expect(materialized).toMatchObject({ skipped: false, files: 1 });
    expect((await driver.exec(sandbox, ['cat', 'input/data.txt'])).stdout).toBe('42\n');

    // Busy sandboxes are never swept.
    clock += 120_000;
    expect(await manager.sweep()).toEqual({ suspended: [], expired: [] });
    manager.runEnded(session.id);
    clock += 120_000;
    expect(await manager.sweep()).toEqual({ suspended: [session.id], expired: [] });
    expect((await docker.getContainer(sandbox.ref).inspect()).State.Running).toBe(false);

    const resumed = await manager.prepare(session, {}, resources);
    expect(resumed.materialized?.skipped).toBe(true);
    expect((await driver.exec(resumed.sandbox, ['cat', 'input/data.txt'])).stdout).toBe('42\n');
    manager.runEnded(session.id);

    clock += 700_000;
    expect(await manager.sweep()).toEqual({ suspended: [], expired: [session.id] });
    await expect(docker.getContainer(sandbox.ref).inspect()).rejects.toMatchObject({ statusCode: 404 });

    // A lost lease kills the sandbox's processes at once; the workspace stays for the Session.
    const other = { id: `sess_${randomBytes(8).toString('hex')}` };
    const prepared = await manager.prepare(other, {});
    await driver.writeFiles(prepared.sandbox, [{ path: 'kept.txt', data: Buffer.from('kept') }]);
    // Killed mid-run, or refused because the sandbox stopped before the exec began: either way it
    // does not finish normally (the outcome is read at once, so no rejection goes unhandled), and
    // it is never left to run out its timeout in a container brought back up after the loss.
    const sleeper = driver.exec(prepared.sandbox, ['sleep', '600'], { timeoutMs: 20_000 }).then(
      (r) => (r.timedOut ? 'timed out' : r.exitCode),
      (err: unknown) => (err as { reason?: string }).reason ?? 'error',
    );
    await manager.leaseLost(other.id);
    const outcome = await sleeper;
    expect(outcome).not.toBe(0);
    expect(outcome).not.toBe('timed out');
    expect((await docker.getContainer(prepared.sandbox.ref).inspect()).State.Running).toBe(false);
    manager.runEnded(other.id);
    const again = await manager.prepare(other, {});
    expect((await driver.exec(again.sandbox, ['cat', 'kept.txt'])).stdout).toBe('kept');

    // The Session ends while a Run still uses the sandbox: the Run's commands go on (an archived
    // Session's turn runs to its end); no new Run is prepared; removed when that Run ends.
    await manager.sessionEnded(other.id);
    expect(manager.sessions()).toContain(other.id);
    await expect(manager.prepare(other, {})).rejects.toMatchObject({ reason: 'not_found' });
    expect((await docker.getContainer(again.sandbox.ref).inspect()).State.Running).toBe(true);
    expect((await driver.exec(again.sandbox, ['cat', 'kept.txt'])).stdout).toBe('kept');
    manager.runEnded(other.id);
    await expect.poll(() => manager.sessions(), { timeout: 20_000 }).not.toContain(other.id);
    await expect.poll(() => driver.sandboxSessions(runnerId), { timeout: 20_000 }).not.toContain(other.id);
    manager.stop();
  }, 60_000);

  it('on start, stops what an earlier life left running and adopts the kept workspaces', async () => {
    const earlier = new SandboxManager({ driver, runnerId, sweepIntervalMs: 0 });
    const session = { id: `sess_${randomBytes(8).toString('hex')}` };
    const { sandbox } = await earlier.prepare(session, {}, [{ type: 'file', id: 'res_1', mount_path: '/notes.txt', content: Buffer.from('n') }]);
    void driver.exec(sandbox, ['sleep', '600'], { timeoutMs: 60_000 }).catch(() => undefined);

    const later = new DockerDriver({ runnerId, docker });
    const restarted = new SandboxManager({ driver: later, runnerId, sweepIntervalMs: 0 });
    const reaped = await restarted.start();
    expect(reaped).toContain(session.id);
    await expect(docker.getContainer(sandbox.ref).inspect()).rejects.toMatchObject({ statusCode: 404 });
    expect(restarted.sessions()).toContain(session.id);
    const resumed = await restarted.prepare(session, {}, [{ type: 'file', id: 'res_1', mount_path: '/notes.txt', content: Buffer.from('n') }]);
    expect(resumed.materialized?.skipped).toBe(true);
    expect((await later.exec(resumed.sandbox, ['cat', 'notes.txt'])).stdout).toBe('n');
    restarted.runEnded(session.id);
    await restarted.sessionEnded(session.id);
    expect(await later.sandboxSessions(runnerId)).not.toContain(session.id);
    restarted.stop();
  }, 60_000);

  it('refuses a container Environment on the process driver', async () => {
    const manager = new SandboxManager({ driver: new ProcessDriver({ runnerId, dataDir }), runnerId, sweepIntervalMs: 0 });
    expect(manager.eligible({ tier: 'container' })).toBe(false);
    await expect(manager.prepare({ id: 'sess_x' }, {})).rejects.toMatchObject({ name: 'SandboxError', reason: 'tier_unsatisfied' });
    const ok = await manager.prepare({ id: 'sess_y' }, { tier: 'process' });
    expect(ok.sandbox.driver).toBe('process');
    await manager.sessionEnded('sess_y');
  });
});

/** A driver whose engine fails where a test says: reaping always, a removal once per listed Session. */
class FailingDriver extends ProcessDriver {
  kept: string[] = [];
  failDestroyOnce = new Set<string>();
  destroyed: string[] = [];

  override async sandboxSessions(): Promise<string[]> {
    return this.kept;
  }

  override async reapOrphans(): Promise<string[]> {
    throw new Error('engine answered 500');
  }

  override async destroy(sessionId: string): Promise<void> {
    if (this.failDestroyOnce.delete(sessionId)) throw new Error('engine answered 500');
    this.destroyed.push(sessionId);
  }

  override async suspend(): Promise<void> {}
}

describe('sandbox manager when the engine fails', () => {
  it('still adopts the kept workspaces and arms the sweep when reaping fails at start', async () => {
    const failing = new FailingDriver({ runnerId, dataDir });
    failing.kept = ['sess_a', 'sess_b'];
    let clock = 1_000;
    const manager = new SandboxManager({ driver: failing, runnerId, idleExpireMs: 1_000, sweepIntervalMs: 10, now: () => clock });
    await expect(manager.start()).rejects.toThrow('engine answered 500');
    expect(manager.sessions()).toEqual(['sess_a', 'sess_b']);
    clock += 1_000;
    // Only the sweep timer removes them now.
    await expect.poll(() => failing.destroyed.sort(), { timeout: 5_000 }).toEqual(['sess_a', 'sess_b']);
    expect(manager.sessions()).toEqual([]);
    manager.stop();
  });

  it('keeps a sandbox whose removal failed listed until a later sweep removes it, and one failure does not stop the sweep', async () => {
    const failing = new FailingDriver({ runnerId, dataDir });
    failing.kept = ['sess_ended', 'sess_idle_1', 'sess_idle_2'];
    let clock = 1_000;
    const manager = new SandboxManager({ driver: failing, runnerId, idleSuspendMs: 0, idleExpireMs: 1_000, sweepIntervalMs: 0, now: () => clock });
    await manager.start().catch(() => undefined);

    failing.failDestroyOnce = new Set(['sess_ended', 'sess_idle_1']);
    await expect(manager.sessionEnded('sess_ended')).rejects.toThrow('engine answered 500');
    expect(manager.sessions()).toContain('sess_ended');
    await expect(manager.prepare({ id: 'sess_ended' }, { tier: 'process' })).rejects.toMatchObject({ reason: 'not_found' });

    // The ended Session is removed again; of the expired ones, the first fails and the second still goes.
    clock += 1_000;
    expect(await manager.sweep()).toEqual({ suspended: [], expired: ['sess_ended', 'sess_idle_2'] });
    expect(manager.sessions()).toEqual(['sess_idle_1']);
    expect(await manager.sweep()).toEqual({ suspended: [], expired: ['sess_idle_1'] });
    expect(manager.sessions()).toEqual([]);
  });
});
