/**
 * `npm run bench:tiers`: sandbox cold start and command latency per isolation tier (container =
 * runc, gvisor = runsc), each beside the same operation done with raw Docker in the same run:
 *
 * - cold: a new Session sandbox (volume + hardened container) → first command done
 *   floor: `docker run --rm --network none [--runtime runsc] <image> true` through dockerode
 * - exec: one command in the warm sandbox (process-group wrapper, output caps)
 *   floor: a bare `docker exec <container> true` in a container of the same runtime
 *
 * The gvisor rows need a runsc runtime registered with dockerd (node docker/gvisor-runtime.mjs).
 */
import { randomBytes } from 'node:crypto';
import Docker from 'dockerode';
import { DockerDriver } from '../runner-daemon/src/sandbox/docker-driver.js';
import type { IsolationTier } from '../runner-daemon/src/sandbox/tiers.js';
import { progress } from './lib/progress.js';
import { printTable, summarize, type Row } from './lib/report.js';

const RUNS = Number(process.env.BENCH_RUNS ?? 20);
const EXECS = Number(process.env.BENCH_EXECS ?? 50);
const docker = new Docker();
const runnerId = `bench-${randomBytes(4).toString('hex')}`;
const driver = new DockerDriver({ runnerId, docker });

async function floorCold(image: string, runtime: string | undefined): Promise<number> {
  const t = performance.now();
  const c = await docker.createContainer({ Image: image, Cmd: ['true'], HostConfig: { AutoRemove: true, NetworkMode: 'none', ...(runtime ? { Runtime: runtime } : {}) } });
  const exited = c.wait({ condition: 'next-exit' });
  await c.start();
  await exited;
  return performance.now() - t;
}

async function floorExec(container: Docker.Container): Promise<number> {
  const t = performance.now();
  const ex = await container.exec({ Cmd: ['true'], AttachStdout: true, AttachStderr: true });
  const stream = await ex.start({ hijack: true, stdin: false });
  await new Promise<void>((r) => {
    stream.on('end', () => r());
    stream.resume();
  });
  return performance.now() - t;
}

async function main(): Promise<void> {
  const verdicts = await driver.verifyTiers();
  const image = 'agentplane/sandbox:latest';
  const rows: Row[] = [];
  for (const v of verdicts) {
    if (!v.ok) {
      process.stdout.write(`tier ${v.tier}: unavailable (${v.detail}); skipped\n`);
      continue;
    }
    const tier: IsolationTier = v.tier;
    const cold: number[] = [];
    const coldFloor: number[] = [];
    const execs: number[] = [];
    const execFloor: number[] = [];
    const p = progress(`${tier} cold`, RUNS);
    for (let i = 0; i < RUNS; i++) {
      const session = { id: `sess_${randomBytes(16).toString('hex')}` };
      const t = performance.now();
      const sb = await driver.ensure(session, { tier });
      await driver.exec(sb, ['true']);
      cold.push(performance.now() - t);
      await driver.destroy(session.id);
      coldFloor.push(await floorCold(image, v.runtime));
      p.tick(i + 1);
    }
    p.end();
    const session = { id: `sess_${randomBytes(16).toString('hex')}` };
    const sb = await driver.ensure(session, { tier });
    const raw = await docker.createContainer({ Image: image, Cmd: ['/usr/bin/sleep', 'infinity'], HostConfig: { AutoRemove: true, NetworkMode: 'none', ...(v.runtime ? { Runtime: v.runtime } : {}) } });
    await raw.start();
    const q = progress(`${tier} exec`, EXECS);
    for (let i = 0; i < EXECS; i++) {
      const t = performance.now();
      await driver.exec(sb, ['true']);
      execs.push(performance.now() - t);
      execFloor.push(await floorExec(raw));
      q.tick(i + 1);
    }
    q.end();
    await driver.destroy(session.id);
    await raw.remove({ force: true }).catch(() => undefined);
    const c = summarize(cold);
    const cf = summarize(coldFloor);
    const e = summarize(execs);
    const ef = summarize(execFloor);
    rows.push(
      { metric: `${tier}: cold start p50`, ours: c.p50, floor: cf.p50, unit: 'ms' },
      { metric: `${tier}: cold start p99`, ours: c.p99, floor: cf.p99, unit: 'ms' },
      { metric: `${tier}: exec p50`, ours: e.p50, floor: ef.p50, unit: 'ms' },
      { metric: `${tier}: exec p99`, ours: e.p99, floor: ef.p99, unit: 'ms' },
    );
  }
  printTable(`sandbox tiers (${RUNS} cold starts, ${EXECS} execs per tier; floors: raw docker run / docker exec with the same runtime)`, rows);
}

main().then(() => process.exit(0), (err: unknown) => {
  process.stderr.write(`${err instanceof Error ? err.stack : String(err)}\n`);
  process.exit(1);
});
