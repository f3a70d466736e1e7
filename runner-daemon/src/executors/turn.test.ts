import { randomBytes } from 'node:crypto';
import Docker from 'dockerode';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createLogger } from '@agentplane/core';
import type { LeaseHandle, LeaseOffer } from '../agent.js';
import { InfrastructureFailure } from '../failures.js';
import { DockerDriver } from '../sandbox/docker-driver.js';
import { ensureSandboxImage } from '../sandbox/image.js';
import { SandboxManager } from '../sandbox/manager.js';
import { SandboxError } from '../sandbox/types.js';
import { turnExecutor } from './turn.js';

/**
 * A sandbox the engine does not start is the machine's failure: the lease fails as
 * `infrastructure` (an `InfrastructureFailure`) and the Run is retried, instead of ending the turn
 * as the agent's work. An Environment this runner cannot serve by its own content stays `work`.
 */
const runnerId = `rturn-${randomBytes(4).toString('hex')}`;
const docker = new Docker();
const log = createLogger({ name: 'turn-test', level: 'silent' });

beforeAll(async () => {
  await ensureSandboxImage({ docker });
}, 120_000);
afterAll(async () => {
  await new DockerDriver({ runnerId, docker }).reapOrphans(runnerId, []);
});

function handleFor(sessionId: string, image: string): LeaseHandle {
  const offer: LeaseOffer = {
    lease_id: `lease_${randomBytes(4).toString('hex')}`, attempt: 1, run_id: 'run_t', session_id: sessionId, accept_within_ms: 5000, lease_ttl_ms: 30_000,
    spec: {
      run_id: 'run_t', session_id: sessionId, thread_id: 'sthr_t', agent: { routing_key: 'default', tools: [] },
      environment: { image, resources: { cpu_millis: 1000, memory_mib: 256, disk_mib: 512, max_duration_seconds: 60 }, network_mode: 'none', retention_mode: 'durable' },
      history: [],
    },
  };
  return {
    lease: { lease_id: offer.lease_id, attempt: 1 }, offer, signal: new AbortController().signal,
    sendEvents: () => undefined,
    deliverEvents: () => Promise.reject(new Error('no events expected')),
    model: { stream: () => { throw new Error('no model step expected'); } },
    checkTool: () => Promise.reject(new Error('no tool expected')),
  };
}

describe('a sandbox that does not start', () => {
  it('fails the lease as infrastructure when the engine is too slow to create it', async () => {
    // The real engine, except that creating a Session's container takes longer than the start bound.
    const late: Promise<unknown>[] = [];
    const slow = new Proxy(docker, {
      get(target, prop, receiver) {
        if (prop !== 'createContainer') return Reflect.get(target, prop, receiver) as unknown;
        return (opts: Docker.ContainerCreateOptions) => {
          const created = (async () => {
            if (opts.name?.includes('-sess_')) await new Promise((r) => setTimeout(r, 3_000));
            return target.createContainer(opts);
          })();
          late.push(created.catch(() => undefined));
          return created;
        };
      },
    });
    const driver = new DockerDriver({ runnerId, docker: slow, startTimeoutMs: 1_500, logger: log });
    const executor = turnExecutor({ sandboxes: new SandboxManager({ driver, runnerId, logger: log }), log, baseUrl: 'http://127.0.0.1:9' });
    const handle = handleFor(`sess_${randomBytes(8).toString('hex')}`, 'agentplane/sandbox:latest');
    const err = await executor.run(handle).then(() => undefined, (e: unknown) => e);
    expect(err).toBeInstanceOf(InfrastructureFailure);
    expect((err as Error).message).toMatch(/did not start within 1500 ms/);
    expect((err as Error).cause).toMatchObject({ name: 'SandboxError', reason: 'start_timeout' });
    // The late creation is removed by the driver once it settles; the workspace volume goes here.
    await Promise.all(late);
    const filters = JSON.stringify({ label: [`agentplane.session=${handle.offer.session_id}`] });
    await expect.poll(async () => (await docker.listContainers({ all: true, filters })).length, { timeout: 30_000, interval: 100 }).toBe(0);
    await driver.destroy(handle.offer.session_id);
  }, 60_000);

  it('stays the Run\'s own failure when its Environment names an image this runner does not have', async () => {
    const driver = new DockerDriver({ runnerId, docker, logger: log });
    const executor = turnExecutor({ sandboxes: new SandboxManager({ driver, runnerId, logger: log }), log, baseUrl: 'http://127.0.0.1:9' });
    const handle = handleFor(`sess_${randomBytes(8).toString('hex')}`, `agentplane/no-such-image:${randomBytes(4).toString('hex')}`);
    const err = await executor.run(handle).then(() => undefined, (e: unknown) => e);
    expect(err).toBeInstanceOf(SandboxError);
    expect(err).toMatchObject({ reason: 'image_missing' });
  }, 60_000);
});
