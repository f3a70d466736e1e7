// bench:console — the web console in the same headless Chromium the tests use (the system
// `chromium`, driven by playwright-core), against a platform started like `npm start`:
//
//  1. open: from navigating to a Session page whose log holds 1,000 events (a realistic mix of
//     messages with markdown and code, thinking, tool calls and results, status changes) to the
//     last event rendered (app load, sign-in check and the SSE replay included), vs reading the
//     same raw SSE replay with fetch in the same page (the floor);
//  2. live: events appended at 100 events/s; latency from the append to the event's element in
//     the conversation (MutationObserver), vs the same events' arrival on a raw fetch SSE reader
//     in the same page at the same time.
import { performance } from 'node:perf_hooks';
import { Redis } from 'ioredis';
import { EventLog, type AppendEvent } from '@agentplane/store';
import { startPlatform } from '../test/harness/platform.js';
import { launchBrowser } from '../test/harness/browser.js';
import { printTable, summarize, type Row } from './lib/report.js';
import { benchHelp } from './lib/help.js';

benchHelp(import.meta.url);

const OPEN_RUNS = Number(process.env.BENCH_OPEN_RUNS ?? 9);
const LIVE_EVENTS = Number(process.env.BENCH_LIVE_EVENTS ?? 1000);
const RATE = 100;
const out = (s: string) => process.stdout.write(`${s}\n`);
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

function mix(i: number, t?: number): AppendEvent {
  const stamp = t === undefined ? {} : { t };
  switch (i % 10) {
    case 0: return { type: 'user.message', payload: { content: `Question ${i}: can you check the build?`, ...stamp } };
    case 1: return { type: 'session.status_running', payload: { run_id: `run_${'0'.repeat(32)}`, ...stamp } };
    case 2: return { type: 'agent.thinking', payload: { content: [{ type: 'thinking', text: 'Let me look at the files first. '.repeat(4) }], ...stamp } };
    case 3: return { type: 'agent.tool_use', payload: { id: `toolu_${i}`, name: 'bash', input: { command: 'ls -la && cat package.json' }, blocking: false, ...stamp } };
    case 4: return { type: 'agent.tool_result', payload: { tool_use_id: `toolu_${i - 1}`, content: 'total 48\n-rw-r--r-- 1 user user 1024 package.json\n'.repeat(5), is_error: false, ...stamp } };
    case 5:
    case 6:
    case 7: return { type: 'agent.message', payload: { content: [{ type: 'text', text: `Step ${i}: the **build** fails in \`src/index.ts\`:\n\n\`\`\`ts\nexport const x: number = "y";\n\`\`\`\n\n- fix the type\n- rerun the tests` }], ...stamp } };
    case 8: return { type: 'agent.message', payload: { content: [{ type: 'text', text: `Done with item ${i}.` }], ...stamp } };
    default: return { type: 'session.status_idle', payload: { stop_reason: { type: 'end_turn' }, ...stamp } };
  }
}

async function main(): Promise<void> {
  out(`bench:console  (${OPEN_RUNS} opens of a 1,000-event Session; ${LIVE_EVENTS} live events at ${RATE}/s; shared machine, expect noise)`);
  const p = await startPlatform({ env: { LOG_LEVEL: 'warn' } });
  const redis = new Redis(p.redisUrl());
  const log = new EventLog(redis);
  const b = await launchBrowser();
  const rows: Row[] = [];
  try {
    const env = await p.root.post<{ id: string }>('/v1/environments', { name: 'bench', image: 'bench:1' });
    const ag = await p.root.post<{ id: string }>('/v1/agents', { name: 'bench', model: 'default' });
    const mk = async () => (await p.root.post<{ id: string }>('/v1/sessions', { agent: ag.id, environment_id: env.id })).id;
    const big = await mk();
    for (let i = 0; i < 1000; i += 100) await log.append(big, Array.from({ length: 100 }, (_, j) => mix(i + j)));
    const lastSeq = (await log.state(big)).seq;

    const page = b.page;
    await page.goto(`${p.baseUrl}/console/`);
    await page.getByLabel('Credential').fill(p.bootstrap.root_key);
    await page.getByRole('button', { name: 'Sign in' }).click();
    await page.getByRole('heading', { name: 'Sessions', level: 1 }).waitFor();
    const headers = { authorization: `Bearer ${p.bootstrap.root_key}`, 'service-version': '2026-08-27' };

    // ---- 1. open a 1,000-event Session ----
    out('open …');
    const open: number[] = [];
    const raw: number[] = [];
    const url = `${p.baseUrl}/console/#/sessions/${big}`;
    for (let r = 0; r < OPEN_RUNS + 1; r++) {
      await page.goto('about:blank');
      await page.goto(url, { waitUntil: 'commit' });
      // A function, not a string: the console's CSP forbids eval, which string predicates use.
      const handle = await page.waitForFunction((seq: number) => {
        const doc = (globalThis as unknown as { document: { querySelector(s: string): unknown } }).document;
        return doc.querySelector(`li[data-seq="${seq}"]`) ? performance.now() : 0;
      }, lastSeq, { polling: 'raf', timeout: 60_000 });
      const ms = Number(await handle.jsonValue());
      const rawMs = Number(await page.evaluate(`(async () => {
        const t0 = performance.now();
        const res = await fetch('/v1/sessions/${big}/events/stream', { headers: ${JSON.stringify(headers)} });
        const reader = res.body.getReader();
        const dec = new TextDecoder();
        let buf = '';
        for (;;) {
          const { value, done } = await reader.read();
          if (done) break;
          buf += dec.decode(value, { stream: true });
          if (buf.includes('id: ${lastSeq}\\n')) break;
          if (buf.length > 1e5) buf = buf.slice(-200);
        }
        const ms = performance.now() - t0;
        await reader.cancel();
        return ms;
      })()`));
      if (r > 0) { open.push(ms); raw.push(rawMs); } // the first round warms caches and JIT
    }
    const o = summarize(open);
    const f = summarize(raw);
    rows.push(
      { metric: 'open 1,000-event Session → last rendered, p50', ours: o.p50, floor: f.p50, unit: 'ms' },
      { metric: 'open 1,000-event Session → last rendered, p99', ours: o.p99, floor: f.p99, unit: 'ms' },
    );

    // ---- 2. live stream at 100 events/s ----
    out('live …');
    const live = await mk();
    await page.goto(`${p.baseUrl}/console/#/sessions/${live}`);
    await page.locator('[data-stream-state="live"]').waitFor();
    await page.evaluate(`(() => {
      window.__rendered = {};
      window.__raw = {};
      const now = () => performance.timeOrigin + performance.now();
      new MutationObserver((list) => {
        const t = now();
        for (const m of list) for (const n of m.addedNodes) if (n.dataset && n.dataset.seq) window.__rendered[n.dataset.seq] = t;
      }).observe(document.querySelector('ol.conversation'), { childList: true });
      (async () => {
        const res = await fetch('/v1/sessions/${live}/events/stream', { headers: ${JSON.stringify(headers)} });
        const reader = res.body.getReader();
        const dec = new TextDecoder();
        let buf = '';
        for (;;) {
          const { value, done } = await reader.read();
          if (done) break;
          const t = now();
          buf += dec.decode(value, { stream: true });
          let i;
          while ((i = buf.indexOf('\\n\\n')) >= 0) {
            const frame = buf.slice(0, i);
            buf = buf.slice(i + 2);
            const id = /^id: (\\d+)$/m.exec(frame);
            if (id) window.__raw[id[1]] = t;
          }
        }
      })();
    })()`);
    const sent = new Map<number, number>();
    const start = performance.now();
    for (let i = 0; i < LIVE_EVENTS; i++) {
      const due = start + (i * 1000) / RATE;
      const wait = due - performance.now();
      if (wait > 0) await sleep(wait);
      const t = performance.timeOrigin + performance.now();
      const r = await log.append(live, [mix(i, t)]);
      if (r.ok) sent.set(r.events[0]?.seq ?? -1, t);
    }
    const lastLive = Math.max(...sent.keys());
    await page.waitForFunction((seq: number) => {
      const w = globalThis as unknown as { __rendered: Record<string, number>; __raw: Record<string, number> };
      return !!w.__rendered[String(seq)] && !!w.__raw[String(seq)];
    }, lastLive, { timeout: 60_000 });
    const seen = (await page.evaluate('({ rendered: window.__rendered, raw: window.__raw })')) as { rendered: Record<string, number>; raw: Record<string, number> };
    const rl: number[] = [];
    const fl: number[] = [];
    for (const [seq, t] of sent) {
      const rt = seen.rendered[String(seq)];
      const ft = seen.raw[String(seq)];
      if (rt !== undefined) rl.push(rt - t);
      if (ft !== undefined) fl.push(ft - t);
    }
    const rs = summarize(rl);
    const fs = summarize(fl);
    out(`live: ${rl.length}/${sent.size} rendered, ${fl.length}/${sent.size} on the raw reader, achieved ${(sent.size / ((performance.now() - start) / 1000)).toFixed(0)} ev/s`);
    rows.push(
      { metric: `live ${RATE} ev/s: append → rendered, p50`, ours: rs.p50, floor: fs.p50, unit: 'ms' },
      { metric: `live ${RATE} ev/s: append → rendered, p99`, ours: rs.p99, floor: fs.p99, unit: 'ms' },
    );
    printTable('web console in headless Chromium (floor: raw fetch SSE reader in the same page)', rows);
  } finally {
    await b.close();
    await redis.quit();
    await p.stop();
  }
}

main().catch((err: unknown) => {
  process.stderr.write(`${err instanceof Error ? err.stack ?? err.message : String(err)}\n`);
  process.exit(1);
});
