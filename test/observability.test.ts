import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { freePort } from '@agentplane/store';
import { ROOT_DIR, waitFor } from './harness/platform.js';
import { promtool, promtoolPresent } from './harness/promtool.js';
import { idleCount, SCRIPT, startTurnPlatform, untilEvents, type TurnPlatform } from './harness/turns.js';
import { sample } from './harness/metrics.js';

/**
 * Operators' view of a platform: Prometheus metrics of every process (valid exposition text,
 * the turn's counters, bounded label sets) and request ids on every API response.
 */
let t: TurnPlatform;
let schedulerUrl = '';
let runnerUrl = '';
const SECRET_TEXT = 'the-quick-observability-fox';


beforeAll(async () => {
  const schedulerPort = await freePort();
  const runnerPort = await freePort();
  schedulerUrl = `http://127.0.0.1:${schedulerPort}`;
  runnerUrl = `http://127.0.0.1:${runnerPort}`;
  t = await startTurnPlatform({
    name: 'observability',
    // The scheduler scans for pools only at its start: the turn's pool is served by its mark's
    // wake-up, and its queue depths must be on /metrics without waiting for a scan.
    env: { SCHEDULER_PORT: String(schedulerPort), RUNNER_METRICS_ADDR: `127.0.0.1:${runnerPort}`, LOG_LEVEL: 'debug', POOL_SCAN_MS: '3600000' },
  });
}, 150_000);
afterAll(async () => {
  await t?.p.stop();
});

const metricsOf = async (base: string): Promise<string> => {
  const r = await fetch(`${base}/metrics`);
  expect(r.status).toBe(200);
  expect(r.headers.get('content-type')).toMatch(/^text\/plain; version=0\.0\.4/);
  return r.text();
};

/**
 * The platform's own series (runtime metrics vary by themselves: GC kinds, handle types). The
 * gateway's frame and close counters are left out: a runner's background frames may add a series.
 */
const series = (text: string): string[] => text.split('\n').filter((l) => l.startsWith('agentplane_') && !l.startsWith('agentplane_gateway_'));

/** `promtool check metrics` over the exposition text: exit 0 and no lint findings. */
function checkMetrics(text: string): void {
  const r = promtool(['check', 'metrics'], text);
  expect(r.output.trim(), 'promtool findings').toBe('');
  expect(r.status).toBe(0);
}

describe('metrics after a turn', () => {
  let sessionId = '';

  beforeAll(async () => {
    sessionId = (await t.api.post<{ id: string }>('/v1/sessions', {
      agent: {
        name: 'scripted', model: 'default', tools: [{ type: 'builtin', name: 'bash' }],
        system: SCRIPT([
          { when: { user_contains: 'observe' }, then: [{ tool: 'bash', input: { command: 'echo observed' } }] },
          { when: { after_tool: 'bash' }, then: [{ reply: 'done: {{tool_result}}' }] },
        ]),
      },
      environment_id: t.envId,
    })).id;
    await t.api.post(`/v1/sessions/${sessionId}/events`, t.msg(`observe ${SECRET_TEXT}`));
    const events = await untilEvents(t.api, sessionId, (e) => idleCount(e) >= 1, 90_000);
    expect(events.find((e) => e.type === 'session.status_idle')?.payload.stop_reason).toMatchObject({ type: 'end_turn' });
  }, 120_000);

  it('the API (with its gateway) serves valid exposition text with the turn\'s counters and runtime metrics', async () => {
    // One runner: a socket it replaced (a reconnect on a loaded machine) is counted until its close is seen.
    const text = await waitFor('one runner socket', async () => {
      const t2 = await metricsOf(t.p.baseUrl);
      return sample(t2, 'agentplane_gateway_connected_runners') === 1 ? t2 : undefined;
    }, 30_000);
    if (promtoolPresent) checkMetrics(text);
    expect(sample(text, 'agentplane_http_requests_total', { operation: 'sessions.sendEvent', status: '200' }) + sample(text, 'agentplane_http_requests_total', { operation: 'sessions.sendEvent', status: '201' })).toBeGreaterThanOrEqual(1);
    expect(sample(text, 'agentplane_model_steps_total', { provider: 'scripted', outcome: 'served' })).toBeGreaterThanOrEqual(2);
    expect(sample(text, 'agentplane_model_time_to_first_event_seconds_count', { provider: 'scripted' })).toBeGreaterThanOrEqual(2);
    expect(sample(text, 'agentplane_session_events_appended_total')).toBeGreaterThanOrEqual(3);
    expect(sample(text, 'agentplane_session_event_append_seconds_count', { outcome: 'ok' })).toBeGreaterThanOrEqual(1);
    expect(sample(text, 'agentplane_run_time_to_first_event_seconds_count')).toBeGreaterThanOrEqual(1);
    expect(sample(text, 'agentplane_gateway_frames_total', { direction: 'in', type: 'lease.complete' })).toBeGreaterThanOrEqual(1);
    expect(sample(text, 'agentplane_gateway_connected_runners')).toBe(1);
    // Runtime metrics of the process.
    expect(sample(text, 'process_resident_memory_bytes')).toBeGreaterThan(0);
    expect(text).toContain('nodejs_eventloop_lag_p99_seconds');
    expect(text).toContain('nodejs_gc_duration_seconds_bucket');
    expect(text).toContain('process_open_fds');
    // Buckets per measure: model time to first token reaches 2 minutes, append starts at 0.1 ms.
    expect(text).toContain('agentplane_model_time_to_first_event_seconds_bucket{le="120",provider="scripted"}');
    expect(text).toMatch(/agentplane_session_event_append_seconds_bucket\{le="0\.0001",outcome="ok"\}/);
  });

  it('the scheduler serves valid exposition text with the lease and its queue wait', async () => {
    const text = await metricsOf(schedulerUrl);
    if (promtoolPresent) checkMetrics(text);
    expect(sample(text, 'agentplane_run_leases_total')).toBeGreaterThanOrEqual(1);
    expect(sample(text, 'agentplane_run_queue_wait_seconds_count')).toBeGreaterThanOrEqual(1);
    expect(text).toMatch(/agentplane_run_queue_wait_seconds_bucket\{le="600",pool="rpool_[0-9a-z]+"\} [1-9]/);
    expect(text).toMatch(/agentplane_run_queue_depth\{pool="rpool_[0-9a-z]+",state="wait"\} \d+/);
    expect(sample(text, 'process_cpu_seconds_total')).toBeGreaterThan(0);
  });

  it('the runner serves valid exposition text on RUNNER_METRICS_ADDR with the completed lease and its sandbox start', async () => {
    const text = await metricsOf(runnerUrl);
    if (promtoolPresent) checkMetrics(text);
    expect(sample(text, 'agentplane_runner_leases_total', { outcome: 'completed' })).toBeGreaterThanOrEqual(1);
    expect(sample(text, 'agentplane_runner_lease_duration_seconds_count')).toBeGreaterThanOrEqual(1);
    expect(sample(text, 'agentplane_runner_sandbox_start_seconds_count')).toBeGreaterThanOrEqual(1);
    expect(sample(text, 'agentplane_runner_connected')).toBe(1);
    expect(sample(text, 'agentplane_runner_held_leases')).toBe(0);
  });

  it('the API reports Redis memory and AOF health', async () => {
    const text = await metricsOf(t.p.baseUrl);
    expect(sample(text, 'agentplane_redis_up')).toBe(1);
    expect(sample(text, 'agentplane_redis_used_memory_bytes')).toBeGreaterThan(0);
    // The embedded Redis runs with its append-only file on.
    expect(sample(text, 'agentplane_redis_aof_enabled')).toBe(1);
    expect(sample(text, 'agentplane_redis_aof_last_write_ok')).toBe(1);
  });

  it('every agentplane metric any process serves is documented in docs/OPERATIONS.md', async () => {
    const doc = readFileSync(join(ROOT_DIR, 'docs/OPERATIONS.md'), 'utf8');
    const served = new Set<string>();
    for (const base of [t.p.baseUrl, schedulerUrl, runnerUrl]) {
      for (const m of (await metricsOf(base)).matchAll(/^# TYPE (agentplane_\w+) /gm)) served.add(m[1] as string);
    }
    expect(served.size).toBeGreaterThan(20);
    expect([...served].filter((m) => !doc.includes(`\`${m}\``))).toEqual([]);
  });

  it('no metric of any process carries the message text', async () => {
    for (const base of [t.p.baseUrl, schedulerUrl, runnerUrl]) expect(await metricsOf(base)).not.toContain(SECRET_TEXT);
  });
});

describe('bounded label sets', () => {
  const mcp = (method: string) =>
    fetch(`${t.p.baseUrl}/v1/mcp`, {
      method: 'POST',
      headers: {
        'content-type': 'application/json', accept: 'application/json, text/event-stream', authorization: `Bearer ${t.p.bootstrap.root_key}`,
        'mcp-protocol-version': '2026-07-28', 'mcp-method': method,
      },
      body: JSON.stringify({
        jsonrpc: '2.0', id: 1, method,
        params: { _meta: { 'io.modelcontextprotocol/protocolVersion': '2026-07-28', 'io.modelcontextprotocol/clientCapabilities': {}, 'io.modelcontextprotocol/clientInfo': { name: 'test', version: '1' } } },
      }),
    }).then(async (r) => ({ status: r.status, body: (await r.json()) as { error?: { code: number } } }));

  it('2,000 made-up MCP methods leave the series count unchanged (they count as other)', async () => {
    // One made-up method first, so the `other` series exists before counting.
    const first = await mcp('made/up-warmup');
    expect(first.body.error?.code).toBe(-32601);
    const before = series(await metricsOf(t.p.baseUrl));
    const names = Array.from({ length: 2000 }, (_, i) => `made/up-${i}-${Math.random().toString(36).slice(2)}`);
    for (let i = 0; i < names.length; i += 50) {
      const res = await Promise.all(names.slice(i, i + 50).map(mcp));
      for (const r of res) expect(r.body.error?.code).toBe(-32601);
    }
    const text = await metricsOf(t.p.baseUrl);
    const after = series(text);
    expect(after.length).toBe(before.length);
    expect(text).not.toContain('made/up');
    expect(sample(text, 'agentplane_mcp_requests_total', { method: 'other', outcome: 'error_-32601' })).toBeGreaterThanOrEqual(2001);
  }, 120_000);
});

describe('request ids', () => {
  const REQ_ID = /^req_[0-9a-f]{24}$/;

  it('every API response carries Request-Id: successes, errors, health and metrics', async () => {
    const ok = await t.p.root.request('GET', '/v1/environments');
    expect(ok.status).toBe(200);
    expect(ok.headers.get('request-id')).toMatch(REQ_ID);
    const unauthenticated = await fetch(`${t.p.baseUrl}/v1/environments`);
    expect(unauthenticated.status).toBe(401);
    expect(unauthenticated.headers.get('request-id')).toMatch(REQ_ID);
    const unmatched = await fetch(`${t.p.baseUrl}/v1/no-such-thing`);
    expect(unmatched.status).toBe(404);
    expect(((await unmatched.json()) as { error: { type: string } }).error.type).toBe('validation.not_found');
    expect(unmatched.headers.get('request-id')).toMatch(REQ_ID);
    const invalid = await t.api.request('POST', '/v1/sessions', { body: { agent: 42 } });
    expect(invalid.status).toBe(400);
    expect(invalid.headers.get('request-id')).toMatch(REQ_ID);
    const rpc = await fetch(`${t.p.baseUrl}/v1/mcp`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: '{}' });
    expect(rpc.status).toBe(401);
    expect(rpc.headers.get('request-id')).toMatch(REQ_ID);
    for (const path of ['/healthz', '/metrics']) expect((await fetch(`${t.p.baseUrl}${path}`)).headers.get('request-id')).toMatch(REQ_ID);
    // Each response its own id.
    const ids = await Promise.all([1, 2, 3].map(async () => (await fetch(`${t.p.baseUrl}/healthz`)).headers.get('request-id')));
    expect(new Set(ids).size).toBe(3);
  });

  it('honours a well-formed X-Request-Id, else the trace id of traceparent; anything else is replaced', async () => {
    const given = await fetch(`${t.p.baseUrl}/v1/no-such-thing`, { headers: { 'x-request-id': 'client-abc.123' } });
    expect(given.headers.get('request-id')).toBe('client-abc.123');
    const traced = await fetch(`${t.p.baseUrl}/healthz`, { headers: { traceparent: '00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01' } });
    expect(traced.headers.get('request-id')).toBe('4bf92f3577b34da6a3ce929d0e0e4736');
    const both = await fetch(`${t.p.baseUrl}/healthz`, { headers: { 'x-request-id': 'mine', traceparent: '00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01' } });
    expect(both.headers.get('request-id')).toBe('mine');
    for (const bad of ['x'.repeat(129), 'has space', 'quote"d', '']) {
      const r = await fetch(`${t.p.baseUrl}/healthz`, { headers: { 'x-request-id': bad } });
      expect(r.headers.get('request-id')).toMatch(REQ_ID);
    }
    const badTrace = await fetch(`${t.p.baseUrl}/healthz`, { headers: { traceparent: '00-00000000000000000000000000000000-00f067aa0ba902b7-01' } });
    expect(badTrace.headers.get('request-id')).toMatch(REQ_ID);
  });

  it('the id is in the request\'s log lines and in its audit record', async () => {
    const id = `obs-${Math.random().toString(36).slice(2)}`;
    const r = await t.p.root.request('POST', `/v1/environments`, {
      headers: { 'x-request-id': id },
      body: { name: 'obs-env', image: 'agentplane/sandbox:latest', resources: { cpu_millis: 500, memory_mib: 128, disk_mib: 128, max_duration_seconds: 60 } },
    });
    expect(r.status).toBe(201);
    expect(r.headers.get('request-id')).toBe(id);
    const line = await waitFor('the request\'s log line', () => {
      const lines = readFileSync(t.p.logFile, 'utf8').split('\n').filter((l) => l.includes(`"request_id":"${id}"`));
      return lines.length > 0 ? lines : undefined;
    }, 10_000);
    expect(JSON.parse(line[0] ?? '{}')).toMatchObject({ service: 'api', request_id: id });
    const audit = await t.p.root.request<{ data: { action: string; request_id: string | null }[] }>('POST', '/v1/audit/export', { body: { action: 'environments.createEnvironment', limit: 1000 } });
    expect(audit.status).toBe(200);
    expect(audit.body.data.map((a) => a.request_id)).toContain(id);
  });
});
