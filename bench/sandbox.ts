/**
 * `npm run bench:sandbox`: sandbox latency beside the Docker floor, measured in the same run.
 *
 * - cold: new Session sandbox (volume + hardened container start) → first command completed
 *   floor: `docker run --rm <same image> true` through dockerode (create, start, wait, auto-remove)
 * - warm: command in the existing Session sandbox (wrapper with process-group tracking, output caps)
 *   floor: a bare `docker exec <container> true` through dockerode
 * - resources: new sandbox with Session resources materialised (a 4 MiB File and a 200-file
 *   repository tar, extracted by the sandbox user) → first command done
 *   floor: `docker run` of the same image with the same bytes copied in (putArchive) before start
 * - colocated: one Run of the agent loop with N bash tool calls (model answered in-process) with
 *   the loop inside the sandbox (bundle placed, node started, stdio relay)
 *   floor: the same Run with the loop in the runner (split: one docker exec per tool call)
 * - egress: in an allowlist sandbox, a command (node) GETs a small body from a listed host on
 *   this machine through the egress proxy (relay in the sandbox, runner's proxy, upstream)
 *   floor: the same command without the request (`node -e 0`)
 * - egress bulk: 16 MiB downloaded through the proxy by a command in the sandbox
 *   floor: 16 MiB written to the command's own stdout (the exec stream the relay rides on)
 */
import { randomBytes } from 'node:crypto';
import { mkdirSync, writeFileSync } from 'node:fs';
import { createServer } from 'node:http';
import type { AddressInfo } from 'node:net';
import Docker from 'dockerode';
import { DockerDriver } from '../runner-daemon/src/sandbox/docker-driver.js';
import { ensureSandboxImage } from '../runner-daemon/src/sandbox/image.js';
import { materializeResources, type ResolvedResource } from '../runner-daemon/src/sandbox/resources.js';
import { createTar } from '../runner-daemon/src/sandbox/tar.js';
import { createLogger } from '@agentplane/core';
import type { ModelClient, ModelStreamEvent } from '@agentplane/protocol';
import { runColocated } from '../runner-daemon/src/executors/colocated.js';
import { HarnessLoop } from '../runner-daemon/src/harness/loop.js';
import type { AgentConfig, SessionEventSink } from '../runner-daemon/src/harness/events.js';
import type { Sandbox } from '../runner-daemon/src/sandbox/types.js';
import { progress } from './lib/progress.js';
import { benchHelp } from './lib/help.js';

benchHelp(import.meta.url);

const RUNS = Number(process.env.BENCH_RUNS ?? 50);
const docker = new Docker();
const runnerId = `bench-${randomBytes(4).toString('hex')}`;
// The egress rows' upstream listens on this machine's loopback: private addresses allowed here.
const driver = new DockerDriver({ runnerId, docker, egress: { allowPrivate: true } });

function percentile(sorted: number[], p: number): number {
  const idx = Math.min(sorted.length - 1, Math.max(0, Math.ceil((p / 100) * sorted.length) - 1));
  return sorted[idx] ?? NaN;
}
function summary(samples: number[]): { p50: number; p99: number; mean: number } {
  const sorted = [...samples].sort((a, b) => a - b);
  return { p50: percentile(sorted, 50), p99: percentile(sorted, 99), mean: samples.reduce((a, b) => a + b, 0) / samples.length };
}
const ms = (n: number): string => `${n.toFixed(1)} ms`.padStart(10);

async function floorRun(image: string): Promise<number> {
  const t = performance.now();
  const c = await docker.createContainer({ Image: image, Cmd: ['true'], HostConfig: { AutoRemove: true, NetworkMode: 'none' } });
  const exited = c.wait({ condition: 'next-exit' });
  await c.start();
  // Measured to the command's exit, like ours; the daemon removes the container afterwards.
  await exited;
  return performance.now() - t;
}

/** The resource bytes of the `resources` row: one 4 MiB File and a 200-file repository snapshot. */
const FILE = randomBytes(4 * 1024 * 1024);
const REPO = createTar(Array.from({ length: 200 }, (_, i) => ({ type: 'file' as const, path: `src/m${i}.ts`, data: Buffer.from(`export const v${i} = ${i};\n`.repeat(20)) })));
const RESOURCES: ResolvedResource[] = [
  { type: 'file', id: 'res_file', mount_path: '/data/input.bin', content: FILE },
  { type: 'repository', id: 'res_repo', mount_path: '/repo', snapshot: { kind: 'tar', data: REPO } },
];

async function floorRunWithBytes(image: string): Promise<number> {
  const t = performance.now();
  const c = await docker.createContainer({ Image: image, Cmd: ['true'], HostConfig: { AutoRemove: true, NetworkMode: 'none' } });
  await c.putArchive(createTar([{ type: 'file', path: 'input.bin', data: FILE }]), { path: '/tmp' });
  await c.putArchive(REPO, { path: '/tmp' });
  const exited = c.wait({ condition: 'next-exit' });
  await c.start();
  await exited;
  return performance.now() - t;
}

/** A model that asks for `calls` bash tool calls, one per step, then ends the turn. */
function toolCallingModel(calls: number): ModelClient {
  let step = 0;
  const usage = { input_tokens: 1, cached_input_tokens: 0, cache_write_input_tokens: 0, output_tokens: 1, reasoning_output_tokens: 0, total_tokens: 2 };
  return {
    async *stream(): AsyncIterable<ModelStreamEvent> {
      step += 1;
      if (step <= calls) yield { type: 'tool_use', id: `call_${step}`, name: 'bash', input: { command: 'true' } };
      yield { type: 'end', stop_reason: step <= calls ? 'tool_use' : 'end_turn', usage, provider: 'bench', model: 'bench' };
    },
  };
}
const AGENT: AgentConfig = { routing_key: 'default', tools: [{ type: 'builtin', name: 'bash' }] };
const NO_SINK: SessionEventSink = { emit: async () => undefined };
const quiet = createLogger({ name: 'bench', level: 'silent' });

async function turn(topology: 'split' | 'colocated', sandbox: Sandbox, calls: number): Promise<number> {
  const model = toolCallingModel(calls);
  const history = [{ role: 'user' as const, content: [{ type: 'text' as const, text: 'go' }] }];
  const t = performance.now();
  const out = topology === 'split'
    ? await new HarnessLoop({ model, driver, sandbox, sink: NO_SINK }).run({ agent: AGENT, history })
    : await runColocated({ driver, sandbox, model, sink: NO_SINK, signal: new AbortController().signal, log: quiet, run: { agent: AGENT, history } });
  if (out.stop_reason.type !== 'end_turn') throw new Error(`${topology} turn ended ${out.stop_reason.type}`);
  return performance.now() - t;
}

async function floorExec(container: Docker.Container): Promise<number> {
  const t = performance.now();
  const exec = await container.exec({ Cmd: ['true'], AttachStdout: true, AttachStderr: true });
  const stream = (await exec.start({ hijack: true, stdin: false })) as NodeJS.ReadableStream;
  stream.resume();
  await new Promise<void>((resolve) => {
    stream.on('end', resolve);
    stream.on('close', resolve);
  });
  await exec.inspect();
  return performance.now() - t;
}

async function main(): Promise<void> {
  const image = await ensureSandboxImage({ docker, onProgress: (l) => console.log(l) });
  console.log(`\nsandbox bench: ${RUNS} runs each, image ${image.tag}\n`);
  await floorRun(image.tag); // warm the image cache for both sides

  const cold: number[] = [];
  const coldFloor: number[] = [];
  const coldProgress = progress('cold', RUNS);
  for (let i = 0; i < RUNS; i++) {
    coldFloor.push(await floorRun(image.tag));
    const session = { id: `sess_${randomBytes(8).toString('hex')}` };
    const t = performance.now();
    const sandbox = await driver.ensure(session, {});
    const res = await driver.exec(sandbox, ['true']);
    cold.push(performance.now() - t);
    if (res.exitCode !== 0) throw new Error(`cold exec failed: ${res.stderr}`);
    await driver.destroy(session.id);
    coldProgress.tick(i + 1);
  }
  coldProgress.end();

  const session = { id: `sess_${randomBytes(8).toString('hex')}` };
  const sandbox = await driver.ensure(session, {});
  const container = docker.getContainer(sandbox.ref);
  const warm: number[] = [];
  const warmFloor: number[] = [];
  const warmProgress = progress('warm', RUNS);
  for (let i = 0; i < RUNS; i++) {
    warmFloor.push(await floorExec(container));
    const t = performance.now();
    const again = await driver.ensure(session, {});
    const res = await driver.exec(again, ['true']);
    warm.push(performance.now() - t);
    if (res.exitCode !== 0) throw new Error(`warm exec failed: ${res.stderr}`);
    warmProgress.tick(i + 1);
  }
  warmProgress.end();
  await driver.destroy(session.id);

  const withResources: number[] = [];
  const withResourcesFloor: number[] = [];
  const resourcesProgress = progress('resources', RUNS);
  for (let i = 0; i < RUNS; i++) {
    withResourcesFloor.push(await floorRunWithBytes(image.tag));
    const s = { id: `sess_${randomBytes(8).toString('hex')}` };
    const t = performance.now();
    const sb = await driver.ensure(s, {});
    const placed = await materializeResources(driver, sb, RESOURCES);
    const res = await driver.exec(sb, ['true']);
    withResources.push(performance.now() - t);
    if (res.exitCode !== 0 || placed.files !== 201) throw new Error(`materialisation failed: ${res.stderr} (${placed.files} files)`);
    await driver.destroy(s.id);
    resourcesProgress.tick(i + 1);
  }
  resourcesProgress.end();

  const tsb = await driver.ensure({ id: `sess_${randomBytes(8).toString('hex')}` }, {});
  const split1: number[] = [];
  const colocated1: number[] = [];
  const split10: number[] = [];
  const colocated10: number[] = [];
  const topologiesProgress = progress('topologies', RUNS);
  for (let i = 0; i < RUNS; i++) {
    split1.push(await turn('split', tsb, 1));
    colocated1.push(await turn('colocated', tsb, 1));
    split10.push(await turn('split', tsb, 10));
    colocated10.push(await turn('colocated', tsb, 10));
    topologiesProgress.tick(i + 1);
  }
  topologiesProgress.end();

  const BULK = 16 * 1024 * 1024;
  const bulkBody = Buffer.alloc(BULK, 'x');
  const upstream = createServer((req, res) => res.end(req.url === '/bulk' ? bulkBody : 'ok'));
  await new Promise<void>((resolve) => upstream.listen(0, '127.0.0.1', resolve));
  const port = (upstream.address() as AddressInfo).port;
  const esb = await driver.ensure({ id: `sess_${randomBytes(8).toString('hex')}` }, { network_mode: 'allowlist', allowed_hosts: [`127.0.0.1:${port}`] });
  const get = (path: string): string[] => ['node', '-e',
    "const u=new URL(process.env.HTTP_PROXY);require('http').get({host:u.hostname,port:u.port,path:process.argv[1]},r=>{let n=0;r.on('data',d=>n+=d.length);r.on('end',()=>console.log(r.statusCode+' '+n))})",
    `http://127.0.0.1:${port}${path}`];
  const timed = async (argv: string[], expect: RegExp): Promise<number> => {
    const t = performance.now();
    const r = await driver.exec(esb, argv, { maxOutputBytes: BULK * 2 });
    const took = performance.now() - t;
    if (r.exitCode !== 0 || !expect.test(r.stdout)) throw new Error(`egress command failed: ${r.stdout.slice(0, 200)} ${r.stderr.slice(0, 200)}`);
    return took;
  };
  const egress: number[] = [];
  const egressFloor: number[] = [];
  const bulk: number[] = [];
  const bulkFloor: number[] = [];
  const egressProgress = progress('egress', RUNS);
  for (let i = 0; i < RUNS; i++) {
    egressFloor.push(await timed(['node', '-e', '0'], /^$/));
    egress.push(await timed(get('/small'), /^200 2\n$/));
    bulkFloor.push(await timed(['node', '-e', `process.stdout.write(Buffer.alloc(${BULK}, 'x'))`], /^x/));
    bulk.push(await timed(get('/bulk'), new RegExp(`^200 ${BULK}\\n$`)));
    egressProgress.tick(i + 1);
  }
  egressProgress.end();
  await new Promise((resolve) => upstream.close(resolve));
  await driver.reapOrphans(runnerId, []);

  const rows = [
    { name: 'cold: new sandbox → first command done', ours: summary(cold), floorName: 'docker run --rm true', floor: summary(coldFloor) },
    { name: 'warm: ensure + command in session sandbox', ours: summary(warm), floorName: 'bare docker exec true', floor: summary(warmFloor) },
    { name: 'cold + 4 MiB File + 200-file repo placed', ours: summary(withResources), floorName: 'docker run + putArchive', floor: summary(withResourcesFloor) },
    { name: 'Run, 1 bash call: colocated loop', ours: summary(colocated1), floorName: 'split loop', floor: summary(split1) },
    { name: 'Run, 10 bash calls: colocated loop', ours: summary(colocated10), floorName: 'split loop', floor: summary(split10) },
    { name: 'egress: node GET via allowlist proxy', ours: summary(egress), floorName: 'node -e 0', floor: summary(egressFloor) },
    { name: 'egress: 16 MiB via allowlist proxy', ours: summary(bulk), floorName: '16 MiB on exec stdout', floor: summary(bulkFloor) },
  ];
  console.log('');
  console.log(`${'measure'.padEnd(44)}${'ours p50'.padStart(10)}${'ours p99'.padStart(10)}  ${'floor'.padEnd(22)}${'p50'.padStart(10)}${'p99'.padStart(10)}  ratio p50  ratio p99`);
  for (const r of rows) {
    console.log(
      `${r.name.padEnd(44)}${ms(r.ours.p50)}${ms(r.ours.p99)}  ${r.floorName.padEnd(22)}${ms(r.floor.p50)}${ms(r.floor.p99)}  ${(r.ours.p50 / r.floor.p50).toFixed(2).padStart(8)}x ${(r.ours.p99 / r.floor.p99).toFixed(2).padStart(8)}x`,
    );
  }
  mkdirSync('bench/results', { recursive: true });
  writeFileSync(`bench/results/sandbox-${Date.now()}.json`, JSON.stringify({ runs: RUNS, image: image.tag, rows }, null, 2));
}

main().catch((err: unknown) => {
  console.error(err);
  void driver.reapOrphans(runnerId, []).finally(() => process.exit(1));
});
