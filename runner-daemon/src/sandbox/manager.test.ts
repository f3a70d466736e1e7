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
  it('prepares with resources, suspends when idle, resumes with the workspace, expires, and removes on lease loss', async () => {
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

    const other = { id: `sess_${randomBytes(8).toString('hex')}` };
    const prepared = await manager.prepare(other, {});
    await manager.leaseLost(other.id);
    await expect(docker.getContainer(prepared.sandbox.ref).inspect()).rejects.toMatchObject({ statusCode: 404 });
    manager.stop();
  });

  it('refuses a container Environment on the process driver', async () => {
    const manager = new SandboxManager({ driver: new ProcessDriver({ runnerId, dataDir }), runnerId, sweepIntervalMs: 0 });
    expect(manager.eligible({ tier: 'container' })).toBe(false);
    await expect(manager.prepare({ id: 'sess_x' }, {})).rejects.toMatchObject({ name: 'SandboxError', reason: 'tier_unsatisfied' });
    const ok = await manager.prepare({ id: 'sess_y' }, { tier: 'process' });
    expect(ok.sandbox.driver).toBe('process');
    await manager.sessionEnded('sess_y');
  });
});
