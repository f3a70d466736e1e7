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
 *
 * Browser tools (where the host has Chromium): navigate, snapshot and screenshot through the
 * built-in tools (playwright-core in the runner, the DevTools protocol over the sandbox exec's
 * stdio, bridged), each beside the same playwright-core call made by a script inside the same
 * container, with the browser launched there on a local pipe. The screenshot tool's File goes to
 * an in-memory store here (no control plane in this bench).
 */
import { randomBytes } from 'node:crypto';
import Docker from 'dockerode';
import { DockerDriver } from '../runner-daemon/src/sandbox/docker-driver.js';
import type { IsolationTier } from '../runner-daemon/src/sandbox/tiers.js';
import { progress } from './lib/progress.js';
import { printTable, summarize, type Row } from './lib/report.js';
import { existsSync } from 'node:fs';
import { ensureBrowserImage } from '../runner-daemon/src/sandbox/browser-image.js';
import { launchInSandbox } from '../runner-daemon/src/sandbox/browser.js';
import { BrowserSession, CHROMIUM_FLAGS, VIEWPORT } from '../runner-daemon/src/harness/tools/browser-session.js';
import { browserNavigateTool, browserScreenshotTool, browserSnapshotTool } from '../runner-daemon/src/harness/tools/browser.js';
import { runTool } from '../runner-daemon/src/harness/tools/builtin.js';
import type { ToolContext } from '../runner-daemon/src/harness/tools/types.js';
import { benchHelp } from './lib/help.js';

benchHelp(import.meta.url);

const RUNS = Number(process.env.BENCH_RUNS ?? 20);
const EXECS = Number(process.env.BENCH_EXECS ?? 50);
const docker = new Docker();
const runnerId = `bench-${randomBytes(4).toString('hex')}`;
const driver = new DockerDriver({ runnerId, docker, browserImage: 'agentplane/sandbox-browser:latest' });
const BROWSER_CALLS = Number(process.env.BENCH_BROWSER_CALLS ?? 30);
const PAGE = '<!doctype html><title>Bench</title><h1>Bench page</h1><ul>' + Array.from({ length: 50 }, (_, i) => `<li><a href="#${i}">item ${i}</a></li>`).join('') + '</ul><button>Go</button>';

/** The same three calls made by playwright-core inside the sandbox, on a browser it launched there. */
const IN_SANDBOX = `
const { chromium } = require('playwright-core');
(async () => {
  const [n, url, flags] = [Number(process.argv[1]), process.argv[2], JSON.parse(process.argv[3])];
  const browser = await chromium.launch({ executablePath: '/usr/lib/chromium/chromium', args: flags, headless: true });
  const page = await (await browser.newContext({ viewport: { width: ${VIEWPORT.width}, height: ${VIEWPORT.height} }, deviceScaleFactor: 1 })).newPage();
  const out = { navigate: [], snapshot: [], screenshot: [] };
  const time = async (k, f) => { const t = performance.now(); await f(); out[k].push(performance.now() - t); };
  for (let i = 0; i < n; i++) {
    await time('navigate', () => page.goto(url, { waitUntil: 'load' }).then(() => page.ariaSnapshot({ mode: 'ai' })));
    await time('snapshot', () => page.ariaSnapshot({ mode: 'ai' }));
    await time('screenshot', () => page.screenshot({ type: 'png' }));
  }
  await browser.close();
  process.stdout.write(JSON.stringify(out));
})().catch((e) => { process.stderr.write(String(e && e.stack || e)); process.exit(1); });
`;

async function browserRows(): Promise<Row[]> {
  if (!existsSync('/usr/lib/chromium/chromium')) {
    process.stdout.write('browser: no Chromium on this host; skipped\n');
    return [];
  }
  await ensureBrowserImage({ docker });
  const session = { id: `sess_${randomBytes(16).toString('hex')}` };
  const sb = await driver.ensure(session, { browser: true, memory_mib: 1024 });
  try {
    await driver.writeFiles(sb, [{ path: 'bench/index.html', data: Buffer.from(PAGE) }]);
    const url = 'file:///workspace/bench/index.html';
    const browser = new BrowserSession(() => launchInSandbox(driver, sb));
    const stored: number[] = [];
    const ctx: ToolContext = {
      driver, sandbox: sb, browser,
      storeFile: async (f) => {
        stored.push(f.data.length);
        return { file_id: `file_${randomBytes(8).toString('hex')}` };
      },
    };
    const ours = { navigate: [] as number[], snapshot: [] as number[], screenshot: [] as number[] };
    // The first call starts the browser: not a steady-state figure, left out of both sides.
    await runTool(browserNavigateTool, ctx, { url });
    const p = progress('browser tools', BROWSER_CALLS);
    for (let i = 0; i < BROWSER_CALLS; i++) {
      for (const [k, tool, input] of [['navigate', browserNavigateTool, { url }], ['snapshot', browserSnapshotTool, {}], ['screenshot', browserScreenshotTool, {}]] as const) {
        const t = performance.now();
        const r = await runTool(tool, ctx, input);
        ours[k].push(performance.now() - t);
        if (r.is_error) throw new Error(`${tool.spec.name}: ${r.content}`);
      }
      p.tick(i + 1);
    }
    p.end();
    await browser.close();
    const floorRun = await driver.exec(sb, ['node', '-e', IN_SANDBOX, String(BROWSER_CALLS + 1), url, JSON.stringify(CHROMIUM_FLAGS)], { timeoutMs: 600_000 });
    if (floorRun.exitCode !== 0) throw new Error(`in-sandbox playwright-core failed: ${floorRun.stderr}`);
    const floor = JSON.parse(floorRun.stdout) as typeof ours;
    const rows: Row[] = [];
    for (const k of ['navigate', 'snapshot', 'screenshot'] as const) {
      const o = summarize(ours[k]);
      const f = summarize(floor[k].slice(1));
      rows.push(
        { metric: `browser_${k} p50`, ours: o.p50, floor: f.p50, unit: 'ms' },
        { metric: `browser_${k} p99`, ours: o.p99, floor: f.p99, unit: 'ms' },
      );
    }
    return rows;
  } finally {
    await driver.destroy(session.id);
  }
}

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
  const browser = await browserRows();
  if (browser.length > 0) {
    printTable(`browser tools (${BROWSER_CALLS} calls each, container tier; navigate includes its snapshot; floor: playwright-core inside the same container on a local pipe)`, browser);
  }
}

main().then(() => process.exit(0), (err: unknown) => {
  process.stderr.write(`${err instanceof Error ? err.stack : String(err)}\n`);
  process.exit(1);
});
