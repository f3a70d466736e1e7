import { createServer, type IncomingHttpHeaders, type Server, type ServerResponse } from 'node:http';
import { createServer as createTcpServer, type Server as TcpServer, type Socket } from 'node:net';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { Redis } from 'ioredis';
import { Webhook } from 'standardwebhooks';
import { HttpClient } from '@agentplane/client';
import { startPlatform, waitFor, type Platform } from './harness/platform.js';
import { errType } from './harness/governance.js';

/**
 * Outbound webhook endpoints against a local receiver: signed deliveries of Session events,
 * retries with backoff (a receiver failing twice then succeeding, one throttling with
 * Retry-After), order per Session, the
 * delivery log, permanent-failure disable and re-enable, the test delivery, the egress guard,
 * deletes (once, and with nothing left behind by a delivery in flight), and a platform restart in the middle of a retry.
 */
interface Received { headers: IncomingHttpHeaders; body: string; status: number; /** When it was answered (ms since the epoch). */ at: number }
/** One answer of the receiver: a status, or a status with response headers (made when it answers, if a function). */
type Answer = number | { status: number; headers: Record<string, string> | (() => Record<string, string>) };
interface Delivery { type: string; seq: number; session_id: string | null; id: string; payload: Record<string, unknown> }

class Receiver {
  readonly got: Received[] = [];
  /** Answers per message id: a queue used first, then `fallback`. */
  readonly plan = new Map<string, Answer[]>();
  fallback = 200;
  /** The next message id not seen before is answered 500 this many times first. */
  failNextNew = 0;
  /** Each message id not seen before takes the next of these answer queues as its plan. */
  readonly answerNextNew: Answer[][] = [];
  private readonly seen = new Set<string>();
  private server!: Server;
  url = '';
  async start(): Promise<void> {
    this.server = createServer((req, res) => {
      const chunks: Buffer[] = [];
      req.on('data', (c: Buffer) => chunks.push(c));
      req.on('end', () => {
        const body = Buffer.concat(chunks).toString('utf8');
        const id = String(req.headers['webhook-id']);
        if (!this.seen.has(id)) {
          this.seen.add(id);
          if (this.failNextNew > 0) this.plan.set(id, new Array<number>(this.failNextNew).fill(500));
          this.failNextNew = 0;
          const answers = this.answerNextNew.shift();
          if (answers) this.plan.set(id, answers);
        }
        const answer = this.plan.get(id)?.shift() ?? this.fallback;
        const status = typeof answer === 'number' ? answer : answer.status;
        const headers = typeof answer === 'number' ? {} : typeof answer.headers === 'function' ? answer.headers() : answer.headers;
        this.got.push({ headers: req.headers, body, status, at: Date.now() });
        res.writeHead(status, headers).end();
      });
    });
    await new Promise<void>((r) => this.server.listen(0, '127.0.0.1', () => r()));
    const addr = this.server.address();
    this.url = `http://127.0.0.1:${typeof addr === 'object' && addr ? addr.port : 0}/hook`;
  }
  ok(): Received[] {
    return this.got.filter((g) => g.status >= 200 && g.status < 300);
  }
  deliveries(): Delivery[] {
    return this.ok().map((g) => JSON.parse(g.body) as Delivery);
  }
  close(): Promise<void> {
    return new Promise((r) => this.server.close(() => r()));
  }
}

const TIMEOUT_MS = 1000;
const ENV = {
  AGENTPLANE_MODE: 'development', WEBHOOK_MAX_ATTEMPTS: '8', WEBHOOK_RETRY_BASE_MS: '200', WEBHOOK_RETRY_MAX_MS: '1000', WEBHOOK_SWEEP_MS: '1000',
  WEBHOOK_TIMEOUT_MS: String(TIMEOUT_MS),
};
let dataDir: string;
let p: Platform;
let api: HttpClient;
let principal: string;
let envId: string;
let rx: Receiver;

interface Endpoint { id: string; version: number; status: string; disabled_reason: string | null; signing_secret?: string }

async function connect(platform: Platform): Promise<void> {
  p = platform;
  api = p.root.with({ workspaceId: p.bootstrap.workspace_id });
}

async function newSession(first: string): Promise<string> {
  return (await api.post<{ id: string }>('/v1/sessions', {
    agent: { name: 'hooked', model: 'default' }, environment_id: envId,
    initial_events: [{ type: 'user.message', payload: { content: first, authored_by: principal, caused_by: { kind: 'api' } } }],
  })).id;
}
const say = (sessionId: string, content: string) =>
  api.post(`/v1/sessions/${sessionId}/events`, { type: 'user.message', payload: { content, authored_by: principal, caused_by: { kind: 'api' } } });

function verify(secret: string, r: Received): void {
  new Webhook(secret).verify(r.body, {
    'webhook-id': String(r.headers['webhook-id']), 'webhook-timestamp': String(r.headers['webhook-timestamp']), 'webhook-signature': String(r.headers['webhook-signature']),
  });
}

beforeAll(async () => {
  dataDir = mkdtempSync(join(tmpdir(), 'agentplane-webhooks-'));
  rx = new Receiver();
  await rx.start();
  await connect(await startPlatform({ dataDir, env: ENV }));
  principal = (await api.post<{ id: string }>(`/v1/organizations/workspaces/${p.bootstrap.workspace_id}/principals`, {
    external_subject_id: 'hook-user', principal_type: 'person', display_name: 'Hook User',
  })).id;
  envId = (await api.post<{ id: string }>('/v1/environments', {
    name: 'sandbox', image: 'agentplane/sandbox:latest', resources: { cpu_millis: 1000, memory_mib: 256, disk_mib: 512, max_duration_seconds: 120 },
  })).id;
}, 120_000);
afterAll(async () => {
  await p?.stop();
  await rx?.close();
  if (dataDir) rmSync(dataDir, { recursive: true, force: true });
});

describe('webhook endpoints', () => {
  it('refuses URLs the egress guard would never deliver to', async () => {
    for (const url of ['http://10.0.0.1/hook', 'https://169.254.169.254/latest', 'https://user:pw@example.com/hook', 'ftp://example.com/x', 'http://example.com/hook']) {
      const r = await api.request('POST', '/v1/webhook-endpoints', { body: { url } });
      expect([url, r.status, errType(r)]).toEqual([url, 400, 'validation.malformed']);
    }
  });

  it('a keyed create or rotation that showed a signing secret is replayed only while that secret is current', async () => {
    const body = { url: rx.url };
    const key = `whe-secret-${Math.random()}`;
    const made = await api.request<Endpoint>('POST', '/v1/webhook-endpoints', { body, idempotencyKey: key });
    expect(made.status).toBe(201);
    const replay = await api.request<Endpoint>('POST', '/v1/webhook-endpoints', { body, idempotencyKey: key });
    expect([replay.status, replay.body.signing_secret]).toEqual([201, made.body.signing_secret]);
    const rotKey = `whe-rot-${Math.random()}`;
    const rotate = () => api.request<Endpoint>('POST', `/v1/webhook-endpoints/${made.body.id}/rotate-secret`, { body: { expected_version: made.body.version, overlap_seconds: 0 }, idempotencyKey: rotKey });
    const rot = await rotate();
    expect(rot.status).toBe(200);
    const stale = await api.request('POST', '/v1/webhook-endpoints', { body, idempotencyKey: key });
    expect([stale.status, errType(stale)]).toEqual([409, 'idempotency.conflict']);
    expect(JSON.stringify(stale.body)).not.toContain(String(made.body.signing_secret));
    const rotReplay = await rotate();
    expect([rotReplay.status, rotReplay.body.signing_secret]).toEqual([200, rot.body.signing_secret]);
    expect((await api.request('DELETE', `/v1/webhook-endpoints/${made.body.id}`)).status).toBe(200);
    const gone = await rotate();
    expect([gone.status, errType(gone)]).toEqual([409, 'idempotency.conflict']);
    expect(JSON.stringify(gone.body)).not.toContain(String(rot.body.signing_secret));
  });

  it('refuses port 0 (no port a delivery can reach), on create and on update', async () => {
    const zero = rx.url.replace(/:\d+\//, ':0/');
    for (const url of ['https://hooks.example.com:0/hook', 'https://hooks.example.com:00/hook', zero]) {
      const r = await api.request('POST', '/v1/webhook-endpoints', { body: { url } });
      expect([url, r.status, errType(r)]).toEqual([url, 400, 'validation.malformed']);
    }
    const e = await api.post<Endpoint & { url: string }>('/v1/webhook-endpoints', { url: rx.url });
    const r = await api.request('POST', `/v1/webhook-endpoints/${e.id}`, { body: { expected_version: e.version, url: zero } });
    expect([r.status, errType(r)]).toEqual([400, 'validation.malformed']);
    expect((await api.get<{ url: string }>(`/v1/webhook-endpoints/${e.id}`)).url).toBe(rx.url);
    await api.request('DELETE', `/v1/webhook-endpoints/${e.id}`);
  });

  it('an update that sets nothing is refused naming what it may set; one that changes nothing keeps the version', async () => {
    const e = await api.post<Endpoint & { description: string | null; updated_at: string }>('/v1/webhook-endpoints', { url: rx.url, description: 'kept' });
    const nothing = await api.request<{ error: { message: string } }>('POST', `/v1/webhook-endpoints/${e.id}`, { body: { expected_version: e.version } });
    expect([nothing.status, errType(nothing)]).toEqual([400, 'validation.malformed']);
    expect(nothing.body.error.message).toContain('description');
    for (const body of [{ description: 'kept' }, { status: 'enabled' }, { url: rx.url }]) {
      const same = await api.request<Endpoint & { updated_at: string }>('POST', `/v1/webhook-endpoints/${e.id}`, { body: { expected_version: e.version, ...body } });
      expect([JSON.stringify(body), same.status, same.body.version, same.body.updated_at]).toEqual([JSON.stringify(body), 200, e.version, e.updated_at]);
    }
    const changed = await api.post<Endpoint>(`/v1/webhook-endpoints/${e.id}`, { expected_version: e.version, description: 'changed' });
    expect(changed.version).toBe(e.version + 1);
    const ahead = await api.request<{ error: { message: string } }>('POST', `/v1/webhook-endpoints/${e.id}`, { body: { expected_version: e.version + 5, description: 'x' } });
    expect([ahead.status, errType(ahead)]).toEqual([409, 'validation.conflict']);
    expect(ahead.body.error.message).toContain('ahead of the current one');
    await api.request('DELETE', `/v1/webhook-endpoints/${e.id}`);
  });

  it('accepts only event types of the catalog, on create and on update', async () => {
    for (const event_types of [['session.status_idel'], ['user.message', 'session.turn_ended'], ['custom.event']]) {
      const r = await api.request<{ error: { message: string } }>('POST', '/v1/webhook-endpoints', { body: { url: rx.url, event_types } });
      expect([event_types, r.status, errType(r)]).toEqual([event_types, 400, 'validation.malformed']);
      expect(r.body.error.message).toContain("'session.status_idle'");
    }
    const e = await api.post<Endpoint & { event_types: string[] }>('/v1/webhook-endpoints', {
      url: rx.url, event_types: ['user.message', 'agent.tool_use', 'session.status_idle', 'session.outcome_ended', 'exec.tool_invocation', 'webhook.test'],
    });
    expect(e.event_types).toHaveLength(6);
    const bad = await api.request('POST', `/v1/webhook-endpoints/${e.id}`, { body: { expected_version: e.version, event_types: ['agent.messages'] } });
    expect([bad.status, errType(bad)]).toEqual([400, 'validation.malformed']);
    expect((await api.get<Endpoint>(`/v1/webhook-endpoints/${e.id}`)).version).toBe(e.version);
    await api.request('DELETE', `/v1/webhook-endpoints/${e.id}`);
  });

  it('sends a signed webhook.test delivery (seq 0, session_id null) at the expected version, and reports a failing receiver', async () => {
    const e = await api.post<Endpoint>('/v1/webhook-endpoints', { url: rx.url, event_types: ['session.status_idle'] });
    expect(e.signing_secret).toMatch(/^whsec_/);
    expect((await api.get<Endpoint>(`/v1/webhook-endpoints/${e.id}`)).signing_secret).toBeUndefined();
    const before = rx.got.length;
    expect(await api.post(`/v1/webhook-endpoints/${e.id}/test`, { expected_version: e.version })).toEqual({ delivered: true, status_code: 200 });
    const got = rx.got[before]!;
    expect(JSON.parse(got.body)).toMatchObject({ type: 'webhook.test', seq: 0, session_id: null, workspace_id: p.bootstrap.workspace_id });
    verify(String(e.signing_secret), got);
    expect(() => verify(`whsec_${Buffer.alloc(32, 7).toString('base64')}`, got)).toThrow();

    const stale = await api.request('POST', `/v1/webhook-endpoints/${e.id}/test`, { body: { expected_version: e.version + 1 } });
    expect([stale.status, errType(stale)]).toEqual([409, 'validation.conflict']);
    rx.fallback = 503;
    try {
      expect(await api.post(`/v1/webhook-endpoints/${e.id}/test`, { expected_version: e.version })).toEqual({ delivered: false, status_code: 503 });
    } finally {
      rx.fallback = 200;
    }
    const log = await api.get<{ data: { event_type: string; status_code: number; test: boolean; outcome: string; error: string | null }[] }>(`/v1/webhook-endpoints/${e.id}/deliveries`);
    expect(log.data.slice(0, 2).map((d) => [d.event_type, d.status_code, d.test, d.outcome, d.error])).toEqual([['webhook.test', 503, true, 'failed', 'status_503'], ['webhook.test', 200, true, 'succeeded', null]]);

    // The log pages with the cursors it issues; a forged one is a 400, never a server error.
    const first = await api.get<{ data: { status_code: number }[]; next_page: string | null }>(`/v1/webhook-endpoints/${e.id}/deliveries`, { limit: 1 });
    expect(first.next_page).toMatch(/^c1_[0-9a-z]+$/);
    const second = await api.get<{ data: { status_code: number }[]; next_page: string | null }>(`/v1/webhook-endpoints/${e.id}/deliveries`, { limit: 1, page: String(first.next_page) });
    expect([...first.data, ...second.data].map((d) => d.status_code)).toEqual([503, 200]);
    for (const page of ['c1_99999999999999999999999s0', 'c1_1s99999999999999999999999', 'c1_1s', 'c1_12-3', 'c1_0s0']) {
      const forged = await api.request('GET', `/v1/webhook-endpoints/${e.id}/deliveries`, { query: { page } });
      expect([page, forged.status, errType(forged)]).toEqual([page, 400, 'validation.malformed']);
    }
    await api.request('DELETE', `/v1/webhook-endpoints/${e.id}`);
  });

  it('delivers every matching event once and in order per Session, signed', async () => {
    const e = await api.post<Endpoint>('/v1/webhook-endpoints', { url: rx.url, event_types: ['user.message'] });
    const secret = String(e.signing_secret);
    const sessions = [await newSession('one-a'), await newSession('one-b')];
    for (const s of sessions) for (const word of ['two', 'three', 'four']) await say(s, `${word}-${s.slice(-4)}`);
    await waitFor('8 deliveries', () => (rx.deliveries().filter((d) => sessions.includes(String(d.session_id))).length >= 8 ? true : undefined), 30_000);
    for (const s of sessions) {
      const mine = rx.deliveries().filter((d) => d.session_id === s);
      expect(mine.map((d) => d.type)).toEqual(['user.message', 'user.message', 'user.message', 'user.message']);
      const seqs = mine.map((d) => d.seq);
      expect([...seqs].sort((a, b) => a - b)).toEqual(seqs);
      expect(new Set(mine.map((d) => d.id)).size).toBe(4);
      expect(mine.map((d) => String((d.payload.content as string) ?? ''))).toEqual(['one-' + (s === sessions[0] ? 'a' : 'b'), `two-${s.slice(-4)}`, `three-${s.slice(-4)}`, `four-${s.slice(-4)}`]);
    }
    for (const r of rx.ok().filter((g) => sessions.includes(String((JSON.parse(g.body) as Delivery).session_id)))) verify(secret, r);
    await api.request('DELETE', `/v1/webhook-endpoints/${e.id}`);
  });

  it('a receiver that fails twice then succeeds gets exactly one success, after the failures, still in order', async () => {
    const e = await api.post<Endpoint>('/v1/webhook-endpoints', { url: rx.url, event_types: ['user.message'] });
    const s = await newSession('flaky-first');
    await waitFor('the first delivery', () => (rx.deliveries().some((d) => d.session_id === s) ? true : undefined), 15_000);
    // The next message is refused twice, then accepted; the one after it must wait for it.
    rx.failNextNew = 2;
    await say(s, 'flaky-second');
    await say(s, 'flaky-third');
    await waitFor('three deliveries', () => (rx.deliveries().filter((d) => d.session_id === s).length >= 3 ? true : undefined), 20_000);
    const mine = rx.deliveries().filter((d) => d.session_id === s);
    expect(mine.map((d) => d.payload.content)).toEqual(['flaky-first', 'flaky-second', 'flaky-third']);
    const second = mine[1]!;
    const attempts = rx.got.filter((g) => g.headers['webhook-id'] === second.id);
    expect(attempts.filter((a) => a.status === 200)).toHaveLength(1);
    expect(attempts.at(-1)?.status).toBe(200);
    expect(attempts.map((a) => a.status)).toEqual([500, 500, 200]);
    const log = await api.get<{ data: { message_id: string; attempt: number; status_code: number; latency_ms: number }[] }>(`/v1/webhook-endpoints/${e.id}/deliveries`, { limit: 100 });
    const forSecond = log.data.filter((d) => d.message_id === second.id).reverse();
    expect(forSecond.map((d) => [d.attempt, d.status_code])).toEqual([[1, 500], [2, 500], [3, 200]]);
    for (const d of forSecond) expect(d.latency_ms).toBeGreaterThanOrEqual(0);
    await api.request('DELETE', `/v1/webhook-endpoints/${e.id}`);
  });

  it('a delivery that exhausts its attempts disables the endpoint; re-enabling delivers it', async () => {
    const e = await api.post<Endpoint>('/v1/webhook-endpoints', { url: rx.url, event_types: ['user.message'] });
    rx.fallback = 500;
    let s = '';
    try {
      s = await newSession('doomed');
      const disabled = await waitFor('the endpoint disabled', async () => {
        const cur = await api.get<Endpoint>(`/v1/webhook-endpoints/${e.id}`);
        return cur.status === 'disabled' ? cur : undefined;
      }, 30_000);
      expect(disabled.disabled_reason).toBe('delivery_failed');
      expect(rx.got.filter((g) => (JSON.parse(g.body) as Delivery).session_id === s)).toHaveLength(8);
    } finally {
      rx.fallback = 200;
    }
    const cur = await api.get<Endpoint>(`/v1/webhook-endpoints/${e.id}`);
    await api.post(`/v1/webhook-endpoints/${e.id}`, { expected_version: cur.version, status: 'enabled' });
    await waitFor('the held delivery', () => (rx.deliveries().some((d) => d.session_id === s) ? true : undefined), 15_000);
    expect(rx.deliveries().filter((d) => d.session_id === s).map((d) => d.payload.content)).toEqual(['doomed']);
    await api.request('DELETE', `/v1/webhook-endpoints/${e.id}`);
  });

  it('410 Gone from the receiver disables the endpoint at once; re-enabling delivers the event it refused', async () => {
    const e = await api.post<Endpoint>('/v1/webhook-endpoints', { url: rx.url, event_types: ['user.message'] });
    rx.fallback = 410;
    let s = '';
    try {
      s = await newSession('gone');
      const disabled = await waitFor('the endpoint disabled', async () => {
        const cur = await api.get<Endpoint>(`/v1/webhook-endpoints/${e.id}`);
        return cur.status === 'disabled' ? cur : undefined;
      }, 30_000);
      expect(disabled.disabled_reason).toBe('delivery_failed');
      // One attempt, not WEBHOOK_MAX_ATTEMPTS: the receiver said it wants no more.
      await new Promise((r) => setTimeout(r, 1500));
      expect(rx.got.filter((g) => (JSON.parse(g.body) as Delivery).session_id === s).map((g) => g.status)).toEqual([410]);
      const log = await api.get<{ data: { status_code: number; error: string | null }[] }>(`/v1/webhook-endpoints/${e.id}/deliveries`);
      expect(log.data.map((d) => [d.status_code, d.error])).toEqual([[410, 'status_410']]);
    } finally {
      rx.fallback = 200;
    }
    const cur = await api.get<Endpoint>(`/v1/webhook-endpoints/${e.id}`);
    await api.post(`/v1/webhook-endpoints/${e.id}`, { expected_version: cur.version, status: 'enabled' });
    await waitFor('the refused delivery', () => (rx.deliveries().some((d) => d.session_id === s) ? true : undefined), 15_000);
    expect(rx.deliveries().filter((d) => d.session_id === s).map((d) => d.payload.content)).toEqual(['gone']);
    await api.request('DELETE', `/v1/webhook-endpoints/${e.id}`);
  });

  it('a 429 or 503 with Retry-After (seconds or an HTTP date) holds the next attempt back at least that long; the delivery then succeeds', async () => {
    const e = await api.post<Endpoint>('/v1/webhook-endpoints', { url: rx.url, event_types: ['user.message'] });
    try {
      rx.answerNextNew.push(
        [{ status: 429, headers: { 'retry-after': '2' } }, 200],
        // An HTTP date has whole seconds: three seconds ahead, truncated, is still more than two ahead.
        [{ status: 503, headers: () => ({ 'retry-after': new Date(Date.now() + 3000).toUTCString() }) }, 200],
      );
      const s = await newSession('throttled-seconds');
      await say(s, 'throttled-date');
      await waitFor('both deliveries', () => (rx.deliveries().filter((d) => d.session_id === s).length >= 2 ? true : undefined), 30_000);
      const mine = rx.deliveries().filter((d) => d.session_id === s);
      expect(mine.map((d) => d.payload.content)).toEqual(['throttled-seconds', 'throttled-date']);
      for (const d of mine) {
        const attempts = rx.got.filter((g) => g.headers['webhook-id'] === d.id);
        expect(attempts.map((a) => a.status)).toEqual([d.payload.content === 'throttled-seconds' ? 429 : 503, 200]);
        // The backoff alone would wait 100–200 ms here (WEBHOOK_RETRY_BASE_MS 200).
        expect(attempts[1]!.at - attempts[0]!.at).toBeGreaterThanOrEqual(1900);
      }
      const log = await api.get<{ data: { message_id: string; attempt: number; status_code: number; retry_after_ms: number | null }[] }>(`/v1/webhook-endpoints/${e.id}/deliveries`, { limit: 100 });
      const first = log.data.filter((d) => d.message_id === mine[0]!.id).reverse();
      expect(first.map((d) => [d.attempt, d.status_code, d.retry_after_ms])).toEqual([[1, 429, 2000], [2, 200, null]]);
      const second = log.data.filter((d) => d.message_id === mine[1]!.id).reverse();
      expect(second.map((d) => [d.attempt, d.status_code])).toEqual([[1, 503], [2, 200]]);
      expect(second[0]!.retry_after_ms).toBeGreaterThan(1000);
      expect(second[0]!.retry_after_ms).toBeLessThanOrEqual(3000);
      expect(second[1]!.retry_after_ms).toBeNull();
    } finally {
      rx.answerNextNew.length = 0;
      await api.request('DELETE', `/v1/webhook-endpoints/${e.id}`);
    }
  });

  it('a Retry-After that is absent, malformed or on another status keeps the normal backoff', async () => {
    const e = await api.post<Endpoint>('/v1/webhook-endpoints', { url: rx.url, event_types: ['user.message'] });
    try {
      // Read loosely, each malformed value would mean a wait of 30 s or more.
      rx.answerNextNew.push([
        429,
        { status: 429, headers: { 'retry-after': '30 seconds' } },
        { status: 503, headers: { 'retry-after': '1e2' } },
        { status: 429, headers: { 'retry-after': '2099-01-01T00:00:00Z' } },
        { status: 500, headers: { 'retry-after': '30' } },
        200,
      ]);
      const s = await newSession('not-throttled');
      await waitFor('the delivery', () => (rx.deliveries().some((d) => d.session_id === s) ? true : undefined), 20_000);
      const id = rx.deliveries().find((d) => d.session_id === s)!.id;
      const attempts = rx.got.filter((g) => g.headers['webhook-id'] === id);
      expect(attempts.map((a) => a.status)).toEqual([429, 429, 503, 429, 500, 200]);
      for (let i = 1; i < attempts.length; i++) expect(attempts[i]!.at - attempts[i - 1]!.at).toBeLessThan(10_000);
      const log = await api.get<{ data: { message_id: string; attempt: number; retry_after_ms: number | null }[] }>(`/v1/webhook-endpoints/${e.id}/deliveries`, { limit: 100 });
      const mine = log.data.filter((d) => d.message_id === id).reverse();
      expect(mine.map((d) => [d.attempt, d.retry_after_ms])).toEqual([[1, null], [2, null], [3, null], [4, null], [5, null], [6, null]]);
    } finally {
      rx.answerNextNew.length = 0;
      await api.request('DELETE', `/v1/webhook-endpoints/${e.id}`);
    }
  });

  it('one deadline bounds the whole exchange: a trickled status line, or a body without end, does not hold a delivery', async () => {
    const timers: NodeJS.Timeout[] = [];
    const sockets: Socket[] = [];
    // Answers the status line and then one header byte every 200 ms, forever: never idle, never done.
    const trickle: TcpServer = createTcpServer((sock) => {
      sockets.push(sock);
      sock.on('data', () => undefined);
      sock.on('error', () => undefined);
      sock.write('HTTP/1.1 200 OK\r\nx-slow: ');
      timers.push(setInterval(() => sock.write('a'), 200));
    });
    // Answers 200 at once, then streams its body without end.
    const endless: Server = createServer((req, res) => {
      req.resume();
      res.writeHead(200, { 'content-type': 'text/plain' });
      const t = setInterval(() => res.write(Buffer.alloc(64 * 1024, 120)), 5);
      timers.push(t);
      res.on('close', () => clearInterval(t));
    });
    const portOf = async (srv: Server | TcpServer): Promise<number> => {
      await new Promise<void>((r) => srv.listen(0, '127.0.0.1', () => r()));
      return (srv.address() as { port: number }).port;
    };
    try {
      const cases = [
        { url: `http://127.0.0.1:${await portOf(trickle)}/hook`, expected: { delivered: false, status_code: 0 }, error: 'timeout' },
        { url: `http://127.0.0.1:${await portOf(endless)}/hook`, expected: { delivered: true, status_code: 200 }, error: null },
      ];
      for (const c of cases) {
        const e = await api.post<Endpoint>('/v1/webhook-endpoints', { url: c.url });
        const started = Date.now();
        const r = await api.request('POST', `/v1/webhook-endpoints/${e.id}/test`, { body: { expected_version: e.version }, signal: AbortSignal.timeout(8000) });
        expect([c.url, r.body]).toEqual([c.url, c.expected]);
        expect(Date.now() - started).toBeLessThan(TIMEOUT_MS + 2000);
        const log = await api.get<{ data: { error: string | null }[] }>(`/v1/webhook-endpoints/${e.id}/deliveries`);
        expect(log.data.map((d) => d.error)).toEqual([c.error]);
        await api.request('DELETE', `/v1/webhook-endpoints/${e.id}`);
      }
    } finally {
      for (const t of timers) clearInterval(t);
      for (const s of sockets) s.destroy();
      trickle.close();
      endless.closeAllConnections();
      endless.close();
    }
  });

  it('an endpoint deleted while a delivery is in flight keeps no delivery log, cursor or secret behind', async () => {
    const held: ServerResponse[] = [];
    const holding = createServer((req, res) => {
      req.resume();
      req.on('end', () => held.push(res));
    });
    await new Promise<void>((r) => holding.listen(0, '127.0.0.1', () => r()));
    const redis = new Redis(p.redisUrl());
    try {
      const e = await api.post<Endpoint>('/v1/webhook-endpoints', { url: `http://127.0.0.1:${(holding.address() as { port: number }).port}/hook`, event_types: ['user.message'] });
      const s = await newSession('in-flight');
      const answer = await waitFor('the delivery to arrive', () => held[0], 15_000);
      const d = await api.request('DELETE', `/v1/webhook-endpoints/${e.id}`);
      expect(d.status).toBe(200);
      answer.writeHead(200).end();
      // The lane's step ends (its job is removed) once it has handled the answer.
      await waitFor('the lane step to end', async () => ((await redis.keys(`ap:{q:webhooks}:webhooks:lane-${e.id}-${s}-*`)).length === 0 ? true : undefined), 15_000);
      expect(await redis.keys(`ap:{w:${p.bootstrap.workspace_id}}:*${e.id}*`)).toEqual([]);
    } finally {
      for (const r of held) r.destroy();
      holding.closeAllConnections();
      holding.close();
      redis.disconnect();
    }
  });

  it('an endpoint is deleted once: of two deletes one answers and the other is 404; a stale expected_version is 409', async () => {
    for (let i = 0; i < 5; i++) {
      const e = await api.post<Endpoint>('/v1/webhook-endpoints', { url: rx.url });
      const both = await Promise.all([api.request('DELETE', `/v1/webhook-endpoints/${e.id}`), api.request('DELETE', `/v1/webhook-endpoints/${e.id}`)]);
      expect(both.map((r) => [r.status, errType(r) ?? null]).sort()).toEqual([[200, null], [404, 'validation.not_found']]);
    }
    const e = await api.post<Endpoint>('/v1/webhook-endpoints', { url: rx.url });
    await api.post(`/v1/webhook-endpoints/${e.id}`, { expected_version: e.version, description: 'changed' });
    const stale = await api.request('DELETE', `/v1/webhook-endpoints/${e.id}`, { query: { expected_version: String(e.version) } });
    expect([stale.status, errType(stale)]).toEqual([409, 'validation.conflict']);
    expect((await api.get<{ description: string }>(`/v1/webhook-endpoints/${e.id}`)).description).toBe('changed');
    expect((await api.request('DELETE', `/v1/webhook-endpoints/${e.id}`, { query: { expected_version: String(e.version + 1) } })).status).toBe(200);
  });

  it('a platform restart in the middle of a retry loses no delivery', async () => {
    const e = await api.post<Endpoint>('/v1/webhook-endpoints', { url: rx.url, event_types: ['user.message'] });
    rx.fallback = 500;
    const s = await newSession('survivor');
    await waitFor('a failed attempt', () => (rx.got.some((g) => (JSON.parse(g.body) as Delivery).session_id === s) ? true : undefined), 15_000);
    await p.stop();
    rx.fallback = 200;
    await connect(await startPlatform({ dataDir, env: ENV }));
    await waitFor('the delivery after the restart', () => (rx.deliveries().some((d) => d.session_id === s) ? true : undefined), 30_000);
    expect(rx.deliveries().filter((d) => d.session_id === s).map((d) => d.payload.content)).toEqual(['survivor']);
    expect((await api.get<Endpoint>(`/v1/webhook-endpoints/${e.id}`)).status).toBe('enabled');
  });
});
