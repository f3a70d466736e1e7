// bench:gateway — time to first token (TTFT) and per-token time of one streamed model step
// through the model gateway vs the same local OpenAI-compatible server called directly, same run.
//
//   floor      : fetch + SSE parse straight against the local provider server (what any client pays)
//   service    : ModelGatewayService.runModelStep in-process (budget check, routing profile,
//                eligibility, credential unseal, adapter, usage recording) → local server
//   REST       : POST /v1/organizations/workspaces/{id}/model-steps on the running platform
//                (HTTP pipeline + auth + the service, streamed back as SSE)
//
//   runner     : a runner's WebSocket (model.request → model.delta … model.end), the path a
//                harness in a sandbox uses: gateway frame handling + the service
import { spawn } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { createLogger, SecretBox } from '@agentplane/core';
import { connectRedis, DocumentStore } from '@agentplane/store';
import { sseMessages } from '@agentplane/models';
import { frame } from '@agentplane/protocol';
import { LeaseFence, LeaseRecords } from '@agentplane/lease';
import { WebSocket } from 'ws';
import { createModelsModule } from '@agentplane/api';
import type { ModelRequest } from '@agentplane/protocol';
import { ROOT_DIR, startPlatform } from '../test/harness/platform.js';
import { printTable, summarize } from './lib/report.js';
import { benchHelp } from './lib/help.js';

benchHelp(import.meta.url);

const STEPS = Number(process.env.BENCH_STEPS ?? 200);
const TOKENS = Number(process.env.BENCH_TOKENS ?? 100);
const WARMUP = 30;

interface Sample {
  /** Request start → first text token. */
  ttft: number;
  /** Request start → last text token. */
  ttlt: number;
}

interface Path {
  name: string;
  once: () => AsyncIterable<unknown>;
  isToken: (e: unknown) => boolean;
  samples: Sample[];
}

async function one(path: Path): Promise<Sample> {
  const t0 = performance.now();
  let first = 0;
  let last = 0;
  let tokens = 0;
  for await (const e of path.once()) {
    if (!path.isToken(e)) continue;
    last = performance.now();
    if (tokens === 0) first = last;
    tokens += 1;
  }
  if (tokens !== TOKENS) throw new Error(`${path.name}: expected ${TOKENS} tokens, got ${tokens}`);
  return { ttft: first - t0, ttlt: last - t0 };
}

async function main(): Promise<void> {
  process.stdout.write(`bench:gateway  ${STEPS} steps per path (interleaved, after ${WARMUP} warm-up rounds), ${TOKENS} streamed tokens per step\n`);
  const text = Array.from({ length: TOKENS }, (_, i) => `t${i}`).join(' ');
  const server = spawn(process.execPath, ['--import', 'tsx', join(ROOT_DIR, 'bench/floors/openai-server.ts'), JSON.stringify({ apiKey: 'sk-bench-local', text })], {
    stdio: ['ignore', 'pipe', 'inherit'],
  });
  const providerUrl = await new Promise<string>((resolve) => server.stdout.once('data', (d: Buffer) => resolve(d.toString().trim())));
  const p = await startPlatform({ env: { LOG_LEVEL: 'warn' } });
  const redis = connectRedis(p.redisUrl(), { name: 'bench-gateway' });
  try {
    const ws = p.bootstrap.workspace_id;
    const cred = await p.root.request('POST', `/v1/organizations/workspaces/${ws}/model-credentials`, {
      body: { key: 'bench', provider_key: 'openai', base_url: providerUrl, secret: 'sk-bench-local' },
    });
    if (cred.status !== 201) throw new Error(`credential: ${cred.status} ${JSON.stringify(cred.body)}`);
    await p.root.request('POST', `/v1/organizations/workspaces/${ws}/model-routing-profiles`, {
      body: { key: 'bench', candidates: [{ credential_key: 'bench', provider_model: 'local-model' }] },
    });
    const request: ModelRequest = { routing_key: 'bench', messages: [{ role: 'user', content: [{ type: 'text', text: 'go' }] }], tools: [] };
    const runner = await connectRunner(p.baseUrl, await enrollRunner(p), p.redisUrl(), p.bootstrap.workspace_id);
    const key = readFileSync(join(p.dataDir, 'master.key'), 'utf8').trim();
    const models = createModelsModule({
      redis, docs: new DocumentStore(redis), secretBox: new SecretBox(Buffer.from(key, 'hex')),
      log: createLogger({ name: 'bench', level: 'warn' }), config: { providerTimeoutMs: 10_000, pricesFile: undefined },
    });
    const headers = p.root.headers({ accept: 'text/event-stream' }, true);
    let n = 0;

    const floor: Path = {
      name: 'direct provider call (floor)',
      samples: [],
      async *once() {
        const res = await fetch(`${providerUrl}/chat/completions`, {
          method: 'POST',
          headers: { 'content-type': 'application/json', authorization: 'Bearer sk-bench-local' },
          body: JSON.stringify({ model: 'local-model', stream: true, stream_options: { include_usage: true }, messages: [{ role: 'user', content: 'go' }] }),
        });
        if (!res.body) throw new Error('no body');
        for await (const m of sseMessages(res.body)) {
          if (m.data === '[DONE]') break;
          yield JSON.parse(m.data) as unknown;
        }
      },
      isToken: (e) => Boolean((e as { choices?: { delta?: { content?: string } }[] }).choices?.[0]?.delta?.content),
    };
    const service: Path = {
      name: 'gateway service, in-process (routing, unseal, adapter, usage)',
      samples: [],
      once: () => models.gateway.runModelStep(ws, request, new AbortController().signal, { session_id: `sess_${'b'.repeat(32)}`, run_id: `run_${'c'.repeat(32)}`, step_id: `bench-${n++}` }),
      isToken: (e) => (e as { type: string }).type === 'text_delta',
    };
    const platform: Path = {
      name: 'platform REST model-steps (HTTP, auth, service, SSE back)',
      samples: [],
      async *once() {
        const res = await fetch(`${p.baseUrl}/v1/organizations/workspaces/${ws}/model-steps`, { method: 'POST', headers, body: JSON.stringify(request) });
        if (res.status !== 200 || !res.body) throw new Error(`model-steps: ${res.status} ${await res.text()}`);
        for await (const m of sseMessages(res.body)) yield m.event;
      },
      isToken: (e) => e === 'text_delta',
    };
    let streamSeq = 0;
    const viaRunner: Path = {
      name: 'runner WebSocket (model.request → model.delta/model.end)',
      samples: [],
      once: () => runner.step(`s${++streamSeq}`, request),
      isToken: (e) => (e as { type: string }).type === 'text_delta',
    };
    const paths = [floor, service, platform, viaRunner];
    for (let i = 0; i < WARMUP + STEPS; i++) {
      for (let j = 0; j < paths.length; j++) {
        const path = paths[(i + j) % paths.length] as Path;
        const s = await one(path);
        if (i >= WARMUP) path.samples.push(s);
      }
    }

    const stats = (path: Path) => {
      const ttft = summarize(path.samples.map((s) => s.ttft));
      const ttlt = summarize(path.samples.map((s) => s.ttlt));
      // Time spent streaming tokens 2..N, per token.
      const perToken = summarize(path.samples.map((s) => ((s.ttlt - s.ttft) / (TOKENS - 1)) * 1000));
      return { ttft, ttlt, perToken };
    };
    const f = stats(floor);
    for (const path of [viaRunner, service, platform]) {
      const o = stats(path);
      printTable(`${path.name} vs ${floor.name}`, [
        { metric: 'time to first token p50', ours: o.ttft.p50, floor: f.ttft.p50, unit: 'ms' },
        { metric: 'time to first token p99', ours: o.ttft.p99, floor: f.ttft.p99, unit: 'ms' },
        { metric: `time to last token p50 (${TOKENS} tok)`, ours: o.ttlt.p50, floor: f.ttlt.p50, unit: 'ms' },
        { metric: 'per-token time p50', ours: o.perToken.p50, floor: f.perToken.p50, unit: 'µs' },
      ]);
      process.stdout.write(`added: TTFT p50 ${(o.ttft.p50 - f.ttft.p50).toFixed(2)} ms, per token p50 ${(o.perToken.p50 - f.perToken.p50).toFixed(1)} µs\n`);
    }
    runner.close();
  } finally {
    await redis.quit();
    await p.stop();
    server.kill('SIGTERM');
  }
}
/** A managed-pool runner credential (the enrollment flow an operator uses for a fleet). */
async function enrollRunner(p: Awaited<ReturnType<typeof startPlatform>>): Promise<string> {
  const ws = p.bootstrap.workspace_id;
  const pool = await p.root.request('POST', '/v1/runner-pools', { body: { name: 'bench', placement: 'managed' } });
  const key = await p.root.request('POST', `/v1/organizations/${p.bootstrap.organization_id}/api-keys`, {
    idempotencyKey: 'bench-runner-key', body: { display_name: 'bench runner', role: 'runner', scope: { type: 'workspace', workspace_id: ws } },
  });
  const enr = await p.anon.with({ token: (key.body as { secret: string }).secret }).request('POST', `/v1/runner-pools/${(pool.body as { id: string }).id}/enrollments`, {
    idempotencyKey: 'bench-enrollment', body: { machine_label: 'bench-1' },
  });
  if (enr.status !== 201) throw new Error(`enrollment: ${enr.status} ${JSON.stringify(enr.body)}`);
  return (enr.body as { secret: string }).secret;
}

interface RunnerClient {
  step(streamId: string, request: ModelRequest): AsyncIterable<unknown>;
  close(): void;
}

/** A raw runner protocol client: hello, then model.request frames; events are yielded as they arrive. */
async function connectRunner(baseUrl: string, secret: string, leaseRedisUrl: string, leaseWorkspace: string): Promise<RunnerClient> {
  const sock = new WebSocket(`${baseUrl.replace('http', 'ws')}/v1/runners/connect`, { headers: { authorization: `Bearer ${secret}` }, perMessageDeflate: false });
  const waiting = new Map<string, (f: { type: string; payload: { stream_id: string; event: unknown } }) => void>();
  let welcomed: (runnerId: string) => void = () => undefined;
  const welcome = new Promise<string>((r) => { welcomed = r; });
  sock.on('message', (d) => {
    const f = JSON.parse(d.toString()) as { type: string; payload: { stream_id: string; event: unknown; runner_id?: string } };
    if (f.type === 'welcome') welcomed(String(f.payload.runner_id));
    else if (f.type === 'model.delta' || f.type === 'model.end') waiting.get(f.payload.stream_id)?.(f);
  });
  await new Promise<void>((resolve, reject) => {
    sock.once('open', () => resolve());
    sock.once('error', reject);
  });
  sock.send(frame('hello', 'h1', {
    protocol_versions: [1], daemon_version: 'bench', status: 'ready', held_leases: [],
    capabilities: { protocol_versions: [1], available_slots: 1, drivers: ['process'], plane_protocols: ['model-gateway-v1'], providers: [] },
  }));
  const runnerId = await welcome;
  // Model steps need a live lease held by this runner: record one, as the scheduler does when it offers a Run.
  // and its Session fence claimed, as the runner's acceptance does (a model step checks it).
  const redis = connectRedis(leaseRedisUrl, { name: 'bench-lease' });
  const lease = {
    lease_id: 'bench-lease', attempt: 1, runner_id: runnerId, workspace_id: leaseWorkspace, run_id: `run_${'0'.repeat(32)}`,
    session_id: `sess_${'0'.repeat(32)}`, thread_id: `sthr_${'0'.repeat(32)}`, pool_id: 'rpool_bench', reply_to: 'ap:bench:offers',
  };
  await new LeaseRecords(redis).put(lease, 3_600_000);
  const fenced = await new LeaseFence(redis).claim({ sessionId: lease.session_id, token: lease.lease_id, runnerId, attempt: 1, runId: lease.run_id }, 3_600_000);
  if (fenced !== 'ok') throw new Error(`the bench's lease fence was not claimed (${fenced})`);
  redis.disconnect();
  return {
    async *step(streamId, request) {
      const queue: { type: string; event: unknown }[] = [];
      let wake: (() => void) | null = null;
      waiting.set(streamId, (f) => {
        queue.push({ type: f.type, event: f.payload.event });
        wake?.();
      });
      sock.send(frame('model.request', streamId, { lease_id: 'bench-lease', attempt: 1, stream_id: streamId, request }));
      try {
        for (;;) {
          const next = queue.shift();
          if (!next) {
            await new Promise<void>((r) => { wake = r; });
            wake = null;
            continue;
          }
          yield next.event;
          if (next.type === 'model.end') return;
        }
      } finally {
        waiting.delete(streamId);
      }
    },
    close: () => sock.close(),
  };
}

main().catch((err: unknown) => {
  process.stderr.write(`${err instanceof Error ? (err.stack ?? err.message) : String(err)}\n`);
  process.exit(1);
});
