import { spawn, execFileSync } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import Docker from 'dockerode';
import { afterAll, describe, expect, it } from 'vitest';
import { DockerDriver } from './docker-driver.js';
import { ensureSandboxImage } from './image.js';
import { ProcessDriver } from './process-driver.js';
import { SANDBOX_LABELS } from '@agentplane/sandbox';

const fixture = fileURLToPath(new URL('./fixtures/crash-child.ts', import.meta.url));
const tsx = fileURLToPath(new URL('../../../node_modules/.bin/tsx', import.meta.url));
const dataDir = mkdtempSync(join(tmpdir(), 'agentplane-crash-'));
const dockerRunners: string[] = [];

/** Starts the stand-in runner, waits for "ready", then kills it with SIGKILL. */
async function crashMidTool(args: string[]): Promise<void> {
  const child = spawn(tsx, [fixture, ...args], { stdio: ['ignore', 'pipe', 'inherit'] });
  await new Promise<void>((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error('fixture did not get ready')), 30_000);
    child.stdout.on('data', (chunk: Buffer) => {
      if (chunk.toString().includes('ready')) {
        clearTimeout(timer);
        resolve();
      }
    });
    child.on('exit', (code) => reject(new Error(`fixture exited early (${code})`)));
  });
  child.kill('SIGKILL');
  await new Promise((r) => child.once('exit', r));
}

afterAll(async () => {
  for (const runnerId of dockerRunners) await new DockerDriver({ runnerId }).reapOrphans(runnerId, []);
  rmSync(dataDir, { recursive: true, force: true });
});

describe('runner killed with SIGKILL mid-tool', () => {
  it('docker: the orphan container is reaped on restart; the workspace is kept for a rescheduled Run', async () => {
    const docker = new Docker();
    await ensureSandboxImage({ docker });
    const runnerId = `crash-${randomBytes(4).toString('hex')}`;
    dockerRunners.push(runnerId);
    const session = `sess_${randomBytes(8).toString('hex')}`;
    await crashMidTool(['docker', runnerId, session]);

    const filters = JSON.stringify({ label: [`${SANDBOX_LABELS.runner}=${runnerId}`] });
    const before = await docker.listContainers({ all: true, filters });
    expect(before).toHaveLength(1);
    const top = await docker.getContainer(before[0]!.Id).top();
    expect(JSON.stringify(top)).toContain('agentplane-crash-docker');

    // Restart: the new daemon reaps what no lease holds; the Session lives on, so its files stay.
    const restarted = new DockerDriver({ runnerId, docker });
    expect(await restarted.reapOrphans(runnerId, [], { keepWorkspacesOf: [session] })).toEqual([session]);
    expect(await docker.listContainers({ all: true, filters })).toEqual([]);
    const sandbox = await restarted.ensure({ id: session }, {});
    expect((await restarted.exec(sandbox, ['cat', 'kept.txt'])).stdout).toBe('before-crash\n');
    expect((await restarted.exec(sandbox, ['ps', '-eo', 'args'])).stdout).not.toContain('agentplane-crash-docker');

    // Session gone: a reap without keeps removes the workspace too.
    await restarted.reapOrphans(runnerId, []);
    const volumes = await docker.listVolumes({ filters });
    expect(volumes.Volumes ?? []).toEqual([]);
  });

  it('process: orphan process groups are found by marker and killed on restart', async () => {
    const runnerId = `crash-${randomBytes(4).toString('hex')}`;
    const session = `sess_${randomBytes(8).toString('hex')}`;
    await crashMidTool(['process', runnerId, session, dataDir]);
    const alive = (): boolean => execFileSync('ps', ['-eo', 'args'], { encoding: 'utf8' }).includes('agentplane-crash-process');
    expect(alive()).toBe(true);
    const restarted = new ProcessDriver({ runnerId, dataDir });
    expect(await restarted.reapOrphans(runnerId, [], { keepWorkspacesOf: [session] })).toEqual([session]);
    await new Promise((r) => setTimeout(r, 200));
    expect(alive()).toBe(false);
    const sandbox = await restarted.ensure({ id: session }, {});
    expect((await restarted.exec(sandbox, ['cat', 'kept.txt'])).stdout).toBe('before-crash\n');
    await restarted.destroy(session);
  });
});
