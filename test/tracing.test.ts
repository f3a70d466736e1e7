import { createServer, type Server } from 'node:http';
import { randomBytes } from 'node:crypto';
import { mkdtempSync, readdirSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { freePort } from '@agentplane/store';
import { startPlatform, waitFor } from './harness/platform.js';
import { readTraceRequest } from './harness/otlp-proto.js';
import { idleCount, SCRIPT, startTurnPlatform, untilEvents, type TurnPlatform } from './harness/turns.js';

/**
 * OpenTelemetry with the standard OTEL_* variables: one turn exports, to an OTLP/HTTP receiver
 * started here, a single trace that continues the caller's traceparent across the API, the
 * scheduler and the runner, parent to child, with no message text in it. The turn's platform
 * exports OTLP/protobuf (the default; the receiver reads it); OTLP/JSON is checked on its own.
 */
interface OtlpValue { stringValue?: string; intValue?: string | number; boolValue?: boolean; doubleValue?: number; arrayValue?: { values: OtlpValue[] } }
interface OtlpAttr { key: string; value: OtlpValue }
interface OtlpSpan { traceId: string; spanId: string; parentSpanId?: string; name: string; kind: number; attributes?: OtlpAttr[] }
interface Exported { service: string; span: OtlpSpan }

const SECRET_TEXT = 'otel-secret-message-text-5f1c';
const COMMAND = 'echo tracing-command-7d2e';
const KIND = { INTERNAL: 1, SERVER: 2, CLIENT: 3, PRODUCER: 4, CONSUMER: 5 } as const;

let t: TurnPlatform;
let receiver: Server;
let receiverUrl = '';
/** Every export body received, as text (what the no-content check reads). */
const bodies: string[] = [];
const spans: Exported[] = [];
/** OTLP/protobuf requests received (the default encoding). */
const protobufBodies: Buffer[] = [];
/** OTLP/JSON requests received, parsed. */
const jsonSpans: Exported[] = [];

beforeAll(async () => {
  const port = await freePort();
  receiver = createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on('data', (c: Buffer) => chunks.push(c));
    req.on('end', () => {
      const raw = Buffer.concat(chunks);
      const text = raw.toString('utf8');
      if (req.url !== '/v1/traces' || req.method !== 'POST') {
        // not an export
      } else if (req.headers['content-type'] === 'application/x-protobuf') {
        bodies.push(text);
        protobufBodies.push(raw);
        spans.push(...readTraceRequest(raw));
      } else {
        bodies.push(text);
        const body = JSON.parse(text) as { resourceSpans?: { resource?: { attributes?: OtlpAttr[] }; scopeSpans?: { spans?: OtlpSpan[] }[] }[] };
        for (const rs of body.resourceSpans ?? []) {
          const service = rs.resource?.attributes?.find((a) => a.key === 'service.name')?.value.stringValue ?? '?';
          for (const ss of rs.scopeSpans ?? []) for (const span of ss.spans ?? []) jsonSpans.push({ service, span });
        }
      }
      res.writeHead(200, { 'content-type': 'application/json' }).end('{}');
    });
  });
  await new Promise<void>((r) => receiver.listen(port, '127.0.0.1', () => r()));
  receiverUrl = `http://127.0.0.1:${port}`;
  t = await startTurnPlatform({
    name: 'tracing',
    env: { OTEL_TRACES_EXPORTER: 'otlp', OTEL_EXPORTER_OTLP_ENDPOINT: `http://127.0.0.1:${port}`, OTEL_BSP_SCHEDULE_DELAY: '100' },
  });
}, 150_000);
afterAll(async () => {
  await t?.p.stop();
  await new Promise<void>((r) => (receiver ? receiver.close(() => r()) : r()));
});

const attr = (s: OtlpSpan, key: string): OtlpValue | undefined => s.attributes?.find((a) => a.key === key)?.value;

describe('one trace per turn', () => {
  const traceId = randomBytes(16).toString('hex');
  const callerSpanId = randomBytes(8).toString('hex');
  let trace: Exported[] = [];

  beforeAll(async () => {
    const sessionId = (await t.api.post<{ id: string }>('/v1/sessions', {
      agent: {
        name: 'scripted', model: 'default', tools: [{ type: 'builtin', name: 'bash' }],
        system: SCRIPT([
          { when: { user_contains: SECRET_TEXT }, then: [{ tool: 'bash', input: { command: COMMAND } }] },
          { when: { after_tool: 'bash' }, then: [{ reply: 'ran it' }] },
        ]),
      },
      environment_id: t.envId,
    })).id;
    const sent = await t.api.request('POST', `/v1/sessions/${sessionId}/events`, {
      body: t.msg(`please ${SECRET_TEXT}`), headers: { traceparent: `00-${traceId}-${callerSpanId}-01` },
    });
    expect(sent.status).toBeLessThan(300);
    expect(sent.headers.get('request-id')).toBe(traceId);
    const events = await untilEvents(t.api, sessionId, (e) => idleCount(e) >= 1, 90_000);
    expect(events.find((e) => e.type === 'session.status_idle')?.payload.stop_reason).toMatchObject({ type: 'end_turn' });
    // Every process exports in batches: wait for the runner's lease span and the idle append.
    trace = await waitFor('the whole trace', () => {
      const mine = spans.filter((s) => s.span.traceId === traceId);
      const leaseDone = mine.some((s) => s.service === 'agentplane-runner' && s.span.name === 'process lease.offer');
      const idle = mine.some((s) => s.span.name === 'append session_events' && JSON.stringify(attr(s.span, 'agentplane.events.types')).includes('session.status_idle'));
      return leaseDone && idle ? mine : undefined;
    }, 30_000);
  }, 150_000);

  const one = (service: string, name: string | RegExp, kind?: number): OtlpSpan => {
    const found = trace.filter((s) => s.service === service && (typeof name === 'string' ? s.span.name === name : name.test(s.span.name)) && (kind === undefined || s.span.kind === kind));
    expect(found.length, `${service} ${String(name)}`).toBeGreaterThanOrEqual(1);
    return (found[0] as Exported).span;
  };

  it('spans of the api, the scheduler and the runner cover the turn', () => {
    expect(new Set(trace.map((s) => s.service))).toEqual(new Set(['agentplane-api', 'agentplane-scheduler', 'agentplane-runner']));
    const http = one('agentplane-api', 'POST /v1/sessions/{session_id}/events', KIND.SERVER);
    expect(attr(http, 'http.route')?.stringValue).toBe('/v1/sessions/{session_id}/events');
    expect(attr(http, 'http.request.method')?.stringValue).toBe('POST');
    expect(Number(attr(http, 'http.response.status_code')?.intValue)).toBeLessThan(300);
    one('agentplane-api', 'send runs', KIND.PRODUCER);
    one('agentplane-scheduler', 'process runs', KIND.CONSUMER);
    one('agentplane-scheduler', 'send lease.offer', KIND.PRODUCER);
    one('agentplane-runner', 'process lease.offer', KIND.CONSUMER);
    one('agentplane-runner', 'invoke_agent');
    one('agentplane-runner', 'execute_tool bash');
    const exec = one('agentplane-runner', 'sandbox exec');
    expect(Number(attr(exec, 'process.exit.code')?.intValue)).toBe(0);
    const runnerChat = one('agentplane-runner', 'chat default', KIND.CLIENT);
    expect(attr(runnerChat, 'gen_ai.operation.name')?.stringValue).toBe('chat');
    const gatewayChat = one('agentplane-api', /^chat /, KIND.CLIENT);
    expect(attr(gatewayChat, 'gen_ai.provider.name')?.stringValue).toBe('scripted');
    expect(Number(attr(gatewayChat, 'gen_ai.usage.input_tokens')?.intValue)).toBeGreaterThan(0);
    expect(attr(gatewayChat, 'gen_ai.usage.output_tokens')?.intValue).toBeDefined();
    one('agentplane-api', 'append session_events', KIND.CLIENT);
  });

  it('links parent to child across processes, from the caller\'s span down', () => {
    const byId = new Map(trace.map((s) => [s.span.spanId, s]));
    const parentOf = (s: OtlpSpan) => (s.parentSpanId ? byId.get(s.parentSpanId) : undefined);
    // The API's server span is the child of the caller's span; every other span has its parent in the trace.
    const http = one('agentplane-api', 'POST /v1/sessions/{session_id}/events');
    expect(http.parentSpanId).toBe(callerSpanId);
    for (const s of trace) if (s.span !== http) expect(parentOf(s.span), `parent of ${s.service} ${s.span.name}`).toBeDefined();
    // Across processes: job → scheduler, offer frame → runner, model.request frame → gateway, events.batch → append.
    expect(parentOf(one('agentplane-scheduler', 'process runs'))).toMatchObject({ service: 'agentplane-api', span: { name: 'send runs' } });
    expect(parentOf(one('agentplane-runner', 'process lease.offer'))).toMatchObject({ service: 'agentplane-scheduler', span: { name: 'send lease.offer' } });
    expect(parentOf(one('agentplane-api', /^chat /))).toMatchObject({ service: 'agentplane-runner', span: { name: 'chat default' } });
    const runnerAppend = trace.find((s) => s.service === 'agentplane-api' && s.span.name === 'append session_events' && parentOf(s.span)?.service === 'agentplane-runner');
    expect(runnerAppend, 'an append made for a runner frame').toBeDefined();
    // And the lease span descends from the caller's request.
    let s: Exported | undefined = byId.get(one('agentplane-runner', 'process lease.offer').spanId);
    const chain: string[] = [];
    while (s) {
      chain.push(`${s.service}:${s.span.name}`);
      s = parentOf(s.span);
    }
    expect(chain.at(-1)).toBe('agentplane-api:POST /v1/sessions/{session_id}/events');
  });

  it('no exported span carries the message text or the tool input', () => {
    const all = bodies.join('\n');
    expect(all.length).toBeGreaterThan(0);
    expect(all).not.toContain(SECRET_TEXT);
    expect(all).not.toContain(COMMAND);
    expect(all).not.toContain('tracing-command');
  });
});

describe('a Run that waits, then is interrupted', () => {
  it('records its wait in the turn\'s trace and its end in the interrupt\'s or the turn\'s', async () => {
    // No runner can serve this Environment: the scheduler records the wait (an append it makes
    // for the job the API queued), and the Run ends when the caller interrupts it.
    const huge = (await t.api.post<{ id: string }>('/v1/environments', {
      name: 'huge-traced', image: 'agentplane/sandbox:latest', resources: { cpu_millis: 256_000, memory_mib: 1_048_576, disk_mib: 4096, max_duration_seconds: 60 },
    })).id;
    const sessionId = (await t.api.post<{ id: string }>('/v1/sessions', { agent: { name: 'waits', model: 'default' }, environment_id: huge })).id;
    const turnTrace = randomBytes(16).toString('hex');
    const sent = await t.api.request('POST', `/v1/sessions/${sessionId}/events`, { body: t.msg('wait'), headers: { traceparent: `00-${turnTrace}-${randomBytes(8).toString('hex')}-01` } });
    expect(sent.status).toBeLessThan(300);
    await untilEvents(t.api, sessionId, (e) => e.some((x) => x.type === 'session.run_waiting'), 30_000);
    const typesOf = (s: OtlpSpan) => JSON.stringify(attr(s, 'agentplane.events.types') ?? '');
    const waitAppend = await waitFor('the wait\'s append in the turn\'s trace', () =>
      spans.find((s) => s.span.traceId === turnTrace && s.span.name === 'append session_events' && typesOf(s.span).includes('session.run_waiting')), 30_000);
    expect(waitAppend.service).toBe('agentplane-scheduler');
    // Its parent is the placement of the job the API queued for this turn.
    const parent = spans.find((s) => s.span.spanId === waitAppend.span.parentSpanId);
    expect(parent?.span.name).toBe('process runs');

    const interruptTrace = randomBytes(16).toString('hex');
    const interrupted = await t.api.request('POST', `/v1/sessions/${sessionId}/events`, {
      body: { type: 'user.interrupt', payload: { authored_by: t.principal, caused_by: { kind: 'api' } } },
      headers: { traceparent: `00-${interruptTrace}-${randomBytes(8).toString('hex')}-01` },
    });
    expect(interrupted.status).toBeLessThan(300);
    const events = await untilEvents(t.api, sessionId, (e) => idleCount(e) >= 1, 30_000);
    expect(events.find((e) => e.type === 'session.status_idle')?.payload.stop_reason).toMatchObject({ type: 'interrupted' });
    // The interrupt ends the queued Run itself, or the scheduler holding the job does on its
    // next check: either way the end's append belongs to one of the two traces, not a new one.
    const idleAppend = await waitFor('the end\'s append', () =>
      spans.find((s) => s.span.name === 'append session_events' && typesOf(s.span).includes('session.status_idle') &&
        [turnTrace, interruptTrace].includes(s.span.traceId)), 30_000);
    expect(idleAppend.span.parentSpanId).toBeTruthy();
  }, 90_000);
});

describe('the SERVER span of a request', () => {
  it('carries the route, the operation and the status answered, without an error status for a client mistake', async () => {
    const traceId = randomBytes(16).toString('hex');
    const missing = await t.api.request('GET', '/v1/principals/prin_00000000000000000000000000000000', { headers: { traceparent: `00-${traceId}-${randomBytes(8).toString('hex')}-01` } });
    expect(missing.status).toBe(404);
    const span = await waitFor('the request span', () => spans.find((s) => s.span.traceId === traceId && s.span.kind === KIND.SERVER)?.span, 30_000);
    expect(span.name).toBe('GET /v1/principals/{principal_id}');
    expect(attr(span, 'http.route')?.stringValue).toBe('/v1/principals/{principal_id}');
    expect(attr(span, 'agentplane.operation')?.stringValue).toBeTruthy();
    expect(attr(span, 'url.path')?.stringValue).toBe('/v1/principals/prin_00000000000000000000000000000000');
    expect(Number(attr(span, 'http.response.status_code')?.intValue)).toBe(404);
    expect((span as OtlpSpan & { status?: { code?: number } }).status?.code ?? 0).not.toBe(2);
  });

  it('names its trace in Request-Id, unless the caller chose the id (then the span carries it)', async () => {
    const path = '/v1/principals/prin_00000000000000000000000000000002';
    const own = await t.api.request('GET', path);
    const ownId = own.headers.get('request-id') ?? '';
    expect(ownId).toMatch(/^[0-9a-f]{32}$/);
    const ownSpan = await waitFor('the request span named by its Request-Id', () => spans.find((s) => s.span.traceId === ownId && s.span.kind === KIND.SERVER)?.span, 30_000);
    expect(attr(ownSpan, 'url.path')?.stringValue).toBe(path);
    expect(attr(ownSpan, 'agentplane.request_id')).toBeUndefined();
    const chosen = `caller-${randomBytes(6).toString('hex')}`;
    const given = await t.api.request('GET', path, { headers: { 'x-request-id': chosen } });
    expect(given.headers.get('request-id')).toBe(chosen);
    const givenSpan = await waitFor('the request span carrying the caller\'s id', () => spans.find((s) => s.span.kind === KIND.SERVER && attr(s.span, 'agentplane.request_id')?.stringValue === chosen)?.span, 30_000);
    expect(givenSpan.traceId).not.toBe(ownId);
  });

  it('is not recorded for a caller whose traceparent is not sampled', async () => {
    const unsampled = randomBytes(16).toString('hex');
    const sampled = randomBytes(16).toString('hex');
    const path = '/v1/principals/prin_00000000000000000000000000000001';
    await t.api.request('GET', path, { headers: { traceparent: `00-${unsampled}-${randomBytes(8).toString('hex')}-00` } });
    await t.api.request('GET', path, { headers: { traceparent: `00-${sampled}-${randomBytes(8).toString('hex')}-01` } });
    // Spans leave in the order they ended: once the later, sampled one is here, the first would be too.
    await waitFor('the sampled request span', () => spans.find((s) => s.span.traceId === sampled), 30_000);
    expect(spans.some((s) => s.span.traceId === unsampled)).toBe(false);
  });

  it('is exported when the platform stops, though its batch was not due yet', async () => {
    // A minute between timed exports: only the stop's flush (the recorded spans to the exporter
    // thread, the thread's batch to the receiver) can send this span before the API exits.
    const p = await startPlatform({ env: { LOG_LEVEL: 'warn', OTEL_TRACES_EXPORTER: 'otlp', OTEL_EXPORTER_OTLP_ENDPOINT: receiverUrl, OTEL_BSP_SCHEDULE_DELAY: '60000' } });
    const traceId = randomBytes(16).toString('hex');
    const id = Buffer.from(traceId, 'hex');
    try {
      const r = await p.root.request('GET', '/v1/principals/prin_00000000000000000000000000000003', { headers: { traceparent: `00-${traceId}-${randomBytes(8).toString('hex')}-01` } });
      expect(r.status).toBe(404);
      expect(protobufBodies.some((b) => b.includes(id))).toBe(false);
    } finally {
      await p.stop();
    }
    expect(protobufBodies.some((b) => b.includes(id))).toBe(true);
  }, 120_000);

  it('reports failed exports in the process log', async () => {
    // Nothing listens on the endpoint: every export fails, and the SDK's report of it reaches the
    // API's log.
    const dataDir = mkdtempSync(join(tmpdir(), 'agentplane-test-'));
    const closed = await freePort();
    const p = await startPlatform({
      dataDir,
      env: { LOG_LEVEL: 'warn', OTEL_TRACES_EXPORTER: 'otlp', OTEL_EXPORTER_OTLP_ENDPOINT: `http://127.0.0.1:${closed}`, OTEL_BSP_SCHEDULE_DELAY: '100', OTEL_EXPORTER_OTLP_TIMEOUT: '1000' },
    });
    try {
      await p.root.request('GET', '/v1/principals/prin_00000000000000000000000000000004');
      const logLines = (): { name?: string; component?: string; level?: number; msg?: string }[] => readdirSync(dataDir)
        .filter((f) => f.startsWith('platform-') && f.endsWith('.log'))
        .flatMap((f) => readFileSync(join(dataDir, f), 'utf8').split('\n'))
        .filter((l) => l.startsWith('{'))
        .map((l) => JSON.parse(l) as { name?: string; component?: string; level?: number; msg?: string });
      const line = await waitFor('the failed export in the api log', () => logLines().find((l) => l.name === 'api' && l.component === 'tracing'), 60_000);
      expect(line.level).toBeGreaterThanOrEqual(40);
      expect(line.msg).toBeTruthy();
    } finally {
      await p.stop();
      rmSync(dataDir, { recursive: true, force: true });
    }
  }, 120_000);

  it('is exported as OTLP/JSON when asked, with the same span', async () => {
    // OTLP/JSON takes the other path: records made into SDK spans for the SDK's JSON exporter.
    const p = await startPlatform({ env: { LOG_LEVEL: 'warn', OTEL_TRACES_EXPORTER: 'otlp', OTEL_EXPORTER_OTLP_ENDPOINT: receiverUrl, OTEL_EXPORTER_OTLP_PROTOCOL: 'http/json', OTEL_BSP_SCHEDULE_DELAY: '100' } });
    try {
      const traceId = randomBytes(16).toString('hex');
      const callerSpan = randomBytes(8).toString('hex');
      const r = await p.root.request('GET', '/v1/principals/prin_00000000000000000000000000000002', { headers: { traceparent: `00-${traceId}-${callerSpan}-01` } });
      expect(r.status).toBe(404);
      const got = await waitFor('a JSON export with the request span', () => jsonSpans.find((s) => s.span.traceId === traceId), 30_000);
      expect(got.service).toBe('agentplane-api');
      expect(got.span).toMatchObject({ name: 'GET /v1/principals/{principal_id}', kind: KIND.SERVER, parentSpanId: callerSpan });
      expect(attr(got.span, 'http.route')?.stringValue).toBe('/v1/principals/{principal_id}');
      expect(Number(attr(got.span, 'http.response.status_code')?.intValue)).toBe(404);
    } finally {
      await p.stop();
    }
  }, 120_000);
});
