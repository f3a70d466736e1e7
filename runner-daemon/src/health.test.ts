import type { Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import type Docker from 'dockerode';
import { afterAll, describe, expect, it } from 'vitest';
import { createLogger } from '@agentplane/core';
import { DockerCheck, runnerHealth, type HealthInput } from './health.js';
import { RunnerMetrics, serveMetrics } from './metrics.js';

const healthy: HealthInput = { started: true, connected: true, driver: 'docker', dockerOk: true, draining: false, tiers: ['container'] };

describe('runner /healthz', () => {
  it('200 only when started, connected and its driver answers; 503 with the reason otherwise, the same fields either way', () => {
    expect(runnerHealth(healthy)).toEqual({ code: 200, body: { status: 'ok', connected: true, driver: 'docker', docker_ok: true, draining: false, tiers: ['container'] } });
    expect(runnerHealth({ ...healthy, started: false, connected: false, driver: null })).toMatchObject({ code: 503, body: { status: 'starting', driver: null } });
    expect(runnerHealth({ ...healthy, connected: false })).toMatchObject({ code: 503, body: { status: 'disconnected', connected: false } });
    expect(runnerHealth({ ...healthy, dockerOk: false, tiers: [] })).toMatchObject({ code: 503, body: { status: 'docker_unavailable', docker_ok: false } });
    // Docker answering with no tier verified (every canary failed, or the tiers were lost) takes no work.
    expect(runnerHealth({ ...healthy, tiers: [] })).toMatchObject({ code: 503, body: { status: 'no_tiers', docker_ok: true, tiers: [] } });
    // The process driver needs no Docker; draining is still healthy (it finishes held work).
    expect(runnerHealth({ ...healthy, driver: 'process', dockerOk: false, tiers: [] })).toMatchObject({ code: 200, body: { status: 'ok', driver: 'process' } });
    expect(runnerHealth({ ...healthy, draining: true })).toMatchObject({ code: 200, body: { status: 'ok', draining: true } });
    // Its credential refused for good: it stops (exit code 5), draining meanwhile.
    expect(runnerHealth({ ...healthy, connected: false, draining: true, credentialRefused: true })).toMatchObject({
      code: 503, body: { status: 'credential_refused', connected: false, draining: true },
    });
  });

  const servers: Server[] = [];
  afterAll(() => {
    for (const s of servers) s.close();
  });

  it('is served next to /metrics with the probe\'s code and body', async () => {
    const metrics = new RunnerMetrics(() => 0, { served: false });
    let answer = runnerHealth({ ...healthy, connected: false });
    const server = await serveMetrics(metrics.registry, '127.0.0.1:0', createLogger({ name: 'test', level: 'silent' }), () => Promise.resolve(answer));
    servers.push(server);
    const url = `http://127.0.0.1:${(server.address() as AddressInfo).port}/healthz`;
    const down = await fetch(url);
    expect(down.status).toBe(503);
    expect(await down.json()).toEqual({ status: 'disconnected', connected: false, driver: 'docker', docker_ok: true, draining: false, tiers: ['container'] });
    answer = runnerHealth(healthy);
    const up = await fetch(url);
    expect(up.status).toBe(200);
    expect(await up.json()).toMatchObject({ status: 'ok', connected: true });
  });

  it('asks Docker at most once per period, however often it is probed', async () => {
    let pings = 0;
    const docker = { ping: () => { pings += 1; return Promise.reject(new Error('no docker')); } } as unknown as Docker;
    const seen: boolean[] = [];
    const check = new DockerCheck(docker, (ok) => seen.push(ok), 60_000);
    expect(await Promise.all([check.ok(), check.ok(), check.ok()])).toEqual([false, false, false]);
    expect(await check.ok()).toBe(false);
    expect(pings).toBe(1);
    expect(seen).toEqual([false]);
  });

  it('the metrics name the Docker engine, the verified tiers and the driver', async () => {
    const m = new RunnerMetrics(() => 0, { served: false });
    m.dockerUp.set(0);
    m.tierVerified.set({ tier: 'container' }, 0);
    m.sandboxDriver.set({ driver: 'process' }, 1);
    const text = await m.registry.metrics();
    expect(text).toContain('agentplane_runner_docker_up 0');
    expect(text).toContain('agentplane_runner_isolation_tier_verified{tier="container"} 0');
    expect(text).toContain('agentplane_runner_sandbox_driver_info{driver="process"} 1');
  });
});
