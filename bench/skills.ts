/**
 * `npm run bench:skills`: a 256-file skill directory imported as a tar archive and placed
 * read-only into a new sandbox, beside `docker cp` of the same tree, measured in the same run.
 *
 * - import: `POST /v1/skills/import` of the archive (streamed tar reader with every limit,
 *   digests, a new immutable version stored)
 *   floor: `docker cp` of the same archive into a running container (putArchive)
 * - materialise: a new Session sandbox, the skill's files read back from the API (the JSON the
 *   runner's runtime route serves) and placed read-only under `.agentplane/skills/<name>/`
 *   floor: `docker run` of the same image with the same tree copied in (`docker cp`) before it starts
 * - import + materialise: both, end to end, against the two floors added up
 */
import { randomBytes } from 'node:crypto';
import { writeFileSync, mkdirSync } from 'node:fs';
import Docker from 'dockerode';
import { HttpClient } from '@agentplane/client';
import { DockerDriver } from '../runner-daemon/src/sandbox/docker-driver.js';
import { ensureSandboxImage } from '../runner-daemon/src/sandbox/image.js';
import { materializeResources, type ResourceSource } from '../runner-daemon/src/sandbox/resources.js';
import { createTar, type TarEntry } from '../runner-daemon/src/sandbox/tar.js';
import { startPlatform } from '../test/harness/platform.js';
import { progress } from './lib/progress.js';
import { printTable, summarize } from './lib/report.js';
import { benchHelp } from './lib/help.js';

benchHelp(import.meta.url);

const RUNS = Number(process.env.BENCH_RUNS ?? 30);
const FILES = 256;
const docker = new Docker();
const driver = new DockerDriver({ runnerId: `bench-${randomBytes(4).toString('hex')}`, docker });

/** 256 files (SKILL.md and 255 others, in a few directories), about 1.5 MiB in all. */
function tree(name: string): TarEntry[] {
  const entries: TarEntry[] = [{ type: 'file', path: 'SKILL.md', data: Buffer.from(`---\nname: ${name}\ndescription: Bench skill.\n---\n\nFollow the references.\n`) }];
  for (let i = 1; i < FILES; i++) entries.push({ type: 'file', path: `references/part${i % 8}/doc${i}.md`, data: Buffer.from(`# doc ${i}\n${'lorem ipsum '.repeat(500)}\n`) });
  return entries;
}

async function floorCp(container: Docker.Container, archive: Buffer): Promise<number> {
  const t = performance.now();
  await container.putArchive(archive, { path: '/tmp' });
  return performance.now() - t;
}

async function floorRunWithTree(image: string, archive: Buffer): Promise<number> {
  const t = performance.now();
  const c = await docker.createContainer({ Image: image, Cmd: ['true'], HostConfig: { AutoRemove: true, NetworkMode: 'none' } });
  await c.putArchive(archive, { path: '/tmp' });
  const exited = c.wait({ condition: 'next-exit' });
  await c.start();
  await exited;
  return performance.now() - t;
}

async function main(): Promise<void> {
  const image = await ensureSandboxImage({ docker, onProgress: (l) => console.log(l) });
  const p = await startPlatform({});
  const ws = p.bootstrap.workspace_id;
  const key = await p.root.post<{ secret: string }>(`/v1/organizations/${p.bootstrap.organization_id}/api-keys`, {
    display_name: 'bench', role: 'developer', scope: { type: 'workspace', workspace_id: ws },
  }, { idempotencyKey: 'bench-skills-key' });
  const api = new HttpClient({ baseUrl: p.baseUrl, token: key.secret });
  const archive = createTar(tree('bench-skill'));
  console.log(`\nskills bench: ${RUNS} runs, ${FILES} files, archive ${(archive.length / 1024).toFixed(0)} KiB, image ${image.tag}\n`);
  const keeper = await docker.createContainer({ Image: image.tag, Cmd: ['sleep', '3600'], HostConfig: { AutoRemove: true, NetworkMode: 'none' } });
  await keeper.start();

  const importMs: number[] = [];
  const placeMs: number[] = [];
  const total: number[] = [];
  const cpFloor: number[] = [];
  const runFloor: number[] = [];
  const totalFloor: number[] = [];
  await floorRunWithTree(image.tag, archive); // warm the image cache for both sides
  const bar = progress('import + materialise', RUNS);
  try {
    for (let i = 0; i < RUNS; i++) {
      const cp = await floorCp(keeper, archive);
      const run = await floorRunWithTree(image.tag, archive);
      cpFloor.push(cp);
      runFloor.push(run);
      totalFloor.push(cp + run);

      const t0 = performance.now();
      const res = await fetch(`${p.baseUrl}/v1/skills/import`, { method: 'POST', headers: { ...api.headers(), 'content-type': 'application/x-tar' }, body: archive });
      const skill = (await res.json()) as { id: string; latest: { version: number; file_count: number } };
      if (res.status !== 201 || skill.latest.file_count !== FILES) throw new Error(`import answered ${res.status}`);
      const t1 = performance.now();
      const session = { id: `sess_${randomBytes(16).toString('hex')}` };
      const sandbox = await driver.ensure(session, {});
      const source: ResourceSource = {
        id: 'skill:bench-skill', type: 'skill', mount_path: '.agentplane/skills/bench-skill', identity: `skill:${skill.id}@${skill.latest.version}`,
        async load() {
          const body = await api.get<{ files: { path: string; content_base64: string }[] }>(`/v1/skills/${skill.id}/versions/${skill.latest.version}/files`);
          return { kind: 'files', files: body.files.map((f) => ({ path: f.path, content: Buffer.from(f.content_base64, 'base64') })), readOnly: true };
        },
      };
      const placed = await materializeResources(driver, sandbox, [source]);
      if (placed.files !== FILES) throw new Error(`placed ${placed.files} files`);
      const t2 = performance.now();
      importMs.push(t1 - t0);
      placeMs.push(t2 - t1);
      total.push(t2 - t0);
      await driver.destroy(session.id);
      bar.tick(i + 1);
    }
  } finally {
    bar.end();
    await keeper.stop().catch(() => undefined);
    await p.stop();
  }
  const rows = [
    ['import p50', summarize(importMs).p50, summarize(cpFloor).p50],
    ['import p99', summarize(importMs).p99, summarize(cpFloor).p99],
    ['materialise (new sandbox) p50', summarize(placeMs).p50, summarize(runFloor).p50],
    ['materialise (new sandbox) p99', summarize(placeMs).p99, summarize(runFloor).p99],
    ['import + materialise p50', summarize(total).p50, summarize(totalFloor).p50],
    ['import + materialise p99', summarize(total).p99, summarize(totalFloor).p99],
  ].map(([metric, ours, floor]) => ({ metric: metric as string, ours: ours as number, floor: floor as number, unit: 'ms' }));
  printTable(`skills: ${FILES}-file import and read-only placement vs docker cp (floor: import = docker cp into a running container; materialise = docker run with the tree copied in)`, rows);
  mkdirSync('bench/results', { recursive: true });
  writeFileSync(`bench/results/skills-${Date.now()}.json`, JSON.stringify({ runs: RUNS, files: FILES, archive_bytes: archive.length, image: image.tag, rows }, null, 2));
}

main().catch((err: unknown) => {
  console.error(err);
  process.exit(1);
});
