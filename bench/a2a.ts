// bench:a2a — A2A `SendMessage` (blocking) on the scripted model, driven with the official
// `@a2a-js/sdk` client by BENCH_CLIENTS (default 32) concurrent clients, each continuing its own
// task (one Session per client, by contextId): p50/p99 latency and requests/s. Beside it, the
// floor measured in the same run: the same turn driven over REST + SSE (POST a user.message, read
// the Session's stream from that event until `session.status_idle`), same clients, same
// platform, same runner. Phases alternate floor / A2A (BENCH_ROUNDS, default 2) so machine drift
// hits both alike. Real turns: scheduler, local runner, Docker sandboxes.
import { performance } from 'node:perf_hooks';
import { SendMessageRequest } from '@a2a-js/sdk';
import { ClientFactory, ClientFactoryOptions, DefaultAgentCardResolver, JsonRpcTransportFactory, type Client } from '@a2a-js/sdk/client';
import { HttpClient, streamEvents, type SseFrame } from '@agentplane/client';
import { startPlatform, waitFor } from '../test/harness/platform.js';
import { printTable, summarize, type Row } from './lib/report.js';
import { benchHelp } from './lib/help.js';

benchHelp(import.meta.url);

const CLIENTS = Number(process.env.BENCH_CLIENTS ?? 32);
const SECONDS = Number(process.env.BENCH_SECONDS ?? 20);
const ROUNDS = Number(process.env.BENCH_ROUNDS ?? 2);
const SCRIPT = `Be brief.\n\`\`\`scripted\n${JSON.stringify({ rules: [{ then: [{ reply: 'ok: {{user}}' }] }] })}\n\`\`\``;
const out = (s: string) => process.stdout.write(`${s}\n`);

interface Lane {
  /** One turn, resolved when it has ended. */
  turn(i: number): Promise<void>;
}

async function drive(lanes: Lane[]): Promise<{ lat: number[]; rps: number }> {
  const lat: number[] = [];
  const end = performance.now() + SECONDS * 1000;
  const start = performance.now();
  await Promise.all(lanes.map(async (lane) => {
    let i = 0;
    while (performance.now() < end) {
      const t = performance.now();
      await lane.turn(i++);
      lat.push(performance.now() - t);
    }
  }));
  return { lat, rps: lat.length / ((performance.now() - start) / 1000) };
}

async function main(): Promise<void> {
  out(`bench:a2a — ${CLIENTS} clients, ${SECONDS} s per phase, ${ROUNDS} rounds (floor: the same turn over REST + SSE)`);
  const p = await startPlatform({ runner: true, scheduler: true, env: { LOG_LEVEL: 'warn' } });
  try {
    const ws = p.bootstrap.workspace_id;
    const key = await p.root.post<{ secret: string }>(`/v1/organizations/${p.bootstrap.organization_id}/api-keys`, {
      display_name: 'bench', role: 'developer', scope: { type: 'workspace', workspace_id: ws }, rate_limit_per_minute: 1_000_000,
    }, { idempotencyKey: 'bench-a2a-key' });
    const api = new HttpClient({ baseUrl: p.baseUrl, token: key.secret });
    const envId = (await api.post<{ id: string }>('/v1/environments', { name: 'bench', image: 'agentplane/sandbox:latest' })).id;
    const agentId = (await api.post<{ id: string }>('/v1/agents', { name: 'bench-a2a', model: 'default', system: SCRIPT })).id;
    const root = (await p.root.post<{ id: string }>('/v1/surface-scopes', { kind: 'root', display_name: 'bench' })).id;
    const inst = (await p.root.post<{ id: string }>('/v1/agent-installations', { agent: { id: agentId }, environment_id: envId, surface_scope_ids: [root] })).id;
    const principal = (await p.root.post<{ id: string }>(`/v1/organizations/workspaces/${ws}/principals`, { external_subject_id: 'bench', principal_type: 'person', display_name: 'Bench' })).id;
    await p.root.post('/v1/permission-assignments', { principal_id: principal, target: { type: 'workspace', id: ws }, actions: ['invoke', 'steer', 'observe'] });
    const secret = (await p.root.post<{ secret: string }>(`/v1/principals/${principal}/access-credentials`, { audience: 'a2a' }, { idempotencyKey: 'bench-a2a-cred' })).secret;
    await waitFor('a ready runner', async () => {
      const r = await p.root.get<{ data: { status: string }[] }>('/v1/runner-pools/presences');
      return r.data.some((x) => x.status === 'ready') ? true : undefined;
    }, 90_000);

    const cardUrl = `${p.baseUrl}/a2a/v1/workspaces/${ws}/agent-installations/${inst}/surface-scopes/${root}/agent-card.json`;
    const fetchImpl: typeof fetch = (input, init) => {
      const h = new Headers(init?.headers);
      h.set('authorization', `Bearer ${secret}`);
      return fetch(input, { ...init, headers: h });
    };
    const factory = new ClientFactory(ClientFactoryOptions.createFrom(ClientFactoryOptions.default, {
      transports: [new JsonRpcTransportFactory({ fetchImpl })], cardResolver: new DefaultAgentCardResolver({ fetchImpl }),
    }));
    const send = (client: Client, text: string, contextId?: string) => client.sendMessage(SendMessageRequest.fromJSON({
      message: { role: 'ROLE_USER', messageId: `b-${Math.random().toString(36).slice(2)}-${Date.now()}`, parts: [{ text }], ...(contextId ? { contextId } : {}) },
    }));

    // Lanes: each client owns one task (A2A) and one Session (REST); a first turn warms its sandbox.
    out('warming up: one turn per lane');
    const a2aLanes: Lane[] = await Promise.all(Array.from({ length: CLIENTS }, async (_, c) => {
      const client = await factory.createFromUrl(cardUrl, '');
      const first = await send(client, `warm ${c}`);
      const taskId = (first as { id: string }).id;
      return { turn: async (i: number) => void (await send(client, `a2a ${c} ${i}`, taskId)) };
    }));
    const restLanes: Lane[] = await Promise.all(Array.from({ length: CLIENTS }, async (_, c) => {
      const sessionId = (await api.post<{ id: string }>('/v1/sessions', { agent: { id: agentId }, environment_id: envId })).id;
      const turn = async (i: number) => {
        const ev = await api.post<{ seq: number }>(`/v1/sessions/${sessionId}/events`, {
          type: 'user.message', payload: { content: `rest ${c} ${i}`, authored_by: principal, caused_by: { kind: 'api' } },
        });
        const ac = new AbortController();
        try {
          for await (const f of streamEvents(api, `/v1/sessions/${sessionId}/events/stream`, { signal: ac.signal, lastEventId: String(ev.seq) }) as AsyncGenerator<SseFrame>) {
            if (f.event === 'session.status_idle') return;
          }
        } finally {
          ac.abort();
        }
      };
      await turn(-1);
      return { turn };
    }));

    const floor: number[] = [];
    const ours: number[] = [];
    let floorRps = 0;
    let oursRps = 0;
    for (let r = 0; r < ROUNDS; r++) {
      const f = await drive(restLanes);
      floor.push(...f.lat);
      floorRps += f.rps / ROUNDS;
      out(`round ${r + 1}: REST + SSE ${f.lat.length} turns, ${f.rps.toFixed(1)}/s`);
      const a = await drive(a2aLanes);
      ours.push(...a.lat);
      oursRps += a.rps / ROUNDS;
      out(`round ${r + 1}: A2A SendMessage ${a.lat.length} turns, ${a.rps.toFixed(1)}/s`);
    }
    const o = summarize(ours);
    const fl = summarize(floor);
    const rows: Row[] = [
      { metric: `turn latency p50 (${CLIENTS} clients)`, ours: o.p50, floor: fl.p50, unit: 'ms' },
      { metric: `turn latency p99 (${CLIENTS} clients)`, ours: o.p99, floor: fl.p99, unit: 'ms' },
      { metric: 'turns per second', ours: oursRps, floor: floorRps, unit: '/s', higherIsBetter: true },
    ];
    printTable('A2A SendMessage (blocking) vs the same turn over REST + SSE', rows);
  } finally {
    await p.stop();
  }
}

main().catch((err: unknown) => {
  process.stderr.write(`${err instanceof Error ? err.stack ?? err.message : String(err)}\n`);
  process.exit(1);
});
