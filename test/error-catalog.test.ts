import { connect } from 'node:net';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { CATALOG } from './harness/catalog.js';
import { startPlatform, type Platform } from './harness/platform.js';


type Json = Record<string, unknown>;

let p: Platform;
let doc: Json;

beforeAll(async () => {
  p = await startPlatform();
  const r = await fetch(`${p.baseUrl}/v1/openapi.json`);
  expect(r.status).toBe(200);
  doc = (await r.json()) as Json;
});
afterAll(async () => {
  await p?.stop();
});

/** Follow a local `$ref` (`#/components/...`). */
function deref(value: unknown): Json {
  let v = value as Json;
  while (typeof v.$ref === 'string') {
    v = (v.$ref as string).slice(2).split('/').reduce<unknown>((acc, k) => (acc as Json)[k], doc) as Json;
  }
  return v;
}

/** The `error.type` values a declared error response admits (undefined: any string). */
function declaredTypes(response: unknown): string[] | undefined {
  const schema = (deref(response).content as Json | undefined)?.['application/json'] as Json | undefined;
  const error = ((schema?.schema as Json | undefined)?.properties as Json | undefined)?.error as Json | undefined;
  const type = (error?.properties as Json | undefined)?.type as Json | undefined;
  return Array.isArray(type?.enum) ? (type.enum as string[]) : undefined;
}

const errType = (body: unknown): string | undefined => (body as { error?: { type?: string } }).error?.type;

/** An agent whose custom tool's input schema nests `depth` levels. */
const deepAgent = (depth: number) =>
  `{"name":"deep","model":"default","tools":[{"type":"custom","name":"t","description":"d","input_schema":{"type":"object","properties":{"a":${'{"x":'.repeat(depth)}1${'}'.repeat(depth)}}}}]}`;

describe('error types: the catalog and nothing else', () => {
  it('every error response the OpenAPI document declares names catalog types only, each under its catalog status', () => {
    const paths = doc.paths as Record<string, Record<string, { operationId: string; responses: Record<string, unknown> }>>;
    let checked = 0;
    const seen = new Set<string>();
    for (const [path, item] of Object.entries(paths)) {
      for (const [method, op] of Object.entries(item)) {
        for (const [status, response] of Object.entries(op.responses)) {
          if (Number(status) < 400) continue;
          const where = `${method.toUpperCase()} ${path} ${status}`;
          const types = declaredTypes(response);
          expect(types, `${where} declares its error types`).toBeDefined();
          for (const t of types ?? []) {
            expect(CATALOG[t], `${where}: '${t}' is not in the catalog`).toBeDefined();
            expect(CATALOG[t], `${where}: '${t}' is a ${CATALOG[t]} in the catalog`).toBe(Number(status));
            seen.add(t);
          }
          checked++;
        }
      }
    }
    expect(checked).toBeGreaterThan(100);
    // The document declares the whole catalog (so a client generated from it knows every type).
    expect([...seen].sort()).toEqual(Object.keys(CATALOG).sort());
  });

  it('a request the HTTP parser refuses still gets a Request-Id and, for a 400, the error body', async () => {
    const url = new URL(p.baseUrl);
    const raw = (request: string) => new Promise<string>((resolve, reject) => {
      const socket = connect(Number(url.port), url.hostname, () => socket.end(request));
      let text = '';
      socket.on('data', (c: Buffer) => { text += c.toString('utf8'); });
      socket.on('close', () => resolve(text));
      // A reset after the answer (the server closing on a request it did not read whole) ends it too.
      socket.on('error', (err) => (text ? resolve(text) : reject(err)));
    });
    for (const request of ['FOO /v1/agents HTTP/1.1\r\nHost: x\r\n\r\n', 'GET /v1/agents HTTP/1.1\r\nHost: x\r\nBad Header\r\n\r\n']) {
      const answer = await raw(request);
      const [head = '', body = ''] = answer.split('\r\n\r\n');
      expect(head.split('\r\n')[0]).toBe('HTTP/1.1 400 Bad Request');
      expect(head).toMatch(/\r\nRequest-Id: \S+/);
      expect(errType(JSON.parse(body) as unknown)).toBe('validation.malformed');
    }
    // An unreadable body does not get ahead of the credential: a bad key with a bad body is a 401.
    for (const [type, body] of [['text/plain', 'hello'], ['application/json', '{bad']] as const) {
      const r = await fetch(`${p.baseUrl}/v1/agents`, { method: 'POST', body, headers: { authorization: 'Bearer ap_key_not_a_real_one', 'service-version': '2026-08-27', 'content-type': type } });
      expect([type, r.status, errType(await r.json())]).toEqual([type, 401, 'auth.invalid_key']);
    }
    // Headers over the limit, and a CONNECT (which Node gives an event of its own), get the same.
    for (const request of [`GET /v1/agents HTTP/1.1\r\nHost: x\r\nX-Big: ${'a'.repeat(64 * 1024)}\r\n\r\n`, 'CONNECT /v1/agents HTTP/1.1\r\nHost: x\r\n\r\n']) {
      const answer = await raw(request);
      const [head = '', body = ''] = answer.split('\r\n\r\n');
      expect(head.split('\r\n')[0], request.slice(0, 20)).toBe('HTTP/1.1 400 Bad Request');
      expect(head).toMatch(/\r\nRequest-Id: \S+/);
      expect(errType(JSON.parse(body) as unknown)).toBe('validation.malformed');
    }
  });

  it('an id is checked against its prefix in a query and inside a body, as in a path', async () => {
    const zeros = '0'.repeat(32);
    const headers = { authorization: `Bearer ${p.bootstrap.root_key}`, 'service-version': '2026-08-27', 'content-type': 'application/json' };
    const list = await fetch(`${p.baseUrl}/v1/sessions?automation_id=sess_${zeros}`, { headers });
    expect([list.status, errType(await list.json())]).toEqual([400, 'validation.malformed']);
    const agent = await fetch(`${p.baseUrl}/v1/agents`, {
      method: 'POST', headers,
      body: JSON.stringify({ name: 'bad-ref', model: 'default', mcp_servers: [{ name: 'm', type: 'a2a_tool_source', tool_source_id: 'tsrc_abc' }] }),
    });
    expect([agent.status, errType(await agent.json())]).toEqual([400, 'validation.malformed']);
  });

  it('the answers that used to leave the catalog now stay in it', async () => {
    const cases: Array<[string, string, RequestInit, number, string]> = [
      ['an unserved method on a collection', '/v1/agents', { method: 'PUT', body: '{}', headers: { 'content-type': 'application/json' } }, 404, 'validation.not_found'],
      ['an unserved method on an events path', '/v1/sessions/sesn_0000000000000000000000000/events', { method: 'GET' }, 404, 'validation.not_found'],
      ['an unknown path', '/v1/nope', { method: 'GET' }, 404, 'validation.not_found'],
      ['a text/plain body', '/v1/agents', { method: 'POST', body: 'hello', headers: { 'content-type': 'text/plain' } }, 400, 'validation.malformed'],
      ['JSON where a multipart upload is expected', '/v1/files', { method: 'POST', body: '{}', headers: { 'content-type': 'application/json' } }, 400, 'validation.malformed'],
      // Nested past 256 levels: refused before any recursive code (the key's fingerprint, storage) overflowed into a 500.
      ['a body nested 5,000 levels deep, with an Idempotency-Key', '/v1/agents', { method: 'POST', body: deepAgent(5000), headers: { 'content-type': 'application/json', 'idempotency-key': 'deep-1' } }, 400, 'validation.malformed'],
      ['a tool schema nested 10,000 levels deep', '/v1/agents', { method: 'POST', body: deepAgent(10_000), headers: { 'content-type': 'application/json' } }, 400, 'validation.malformed'],
      // Read as it came, a compressed body or one in another charset would be refused as bad JSON, or read as another.
      ['a gzip-encoded body', '/v1/agents', { method: 'POST', body: '{"name":"z","model":"default"}', headers: { 'content-type': 'application/json', 'content-encoding': 'gzip' } }, 400, 'validation.malformed'],
      ['a UTF-16 charset', '/v1/agents', { method: 'POST', body: '{"name":"z","model":"default"}', headers: { 'content-type': 'application/json; charset=utf-16' } }, 400, 'validation.malformed'],
      ['a UTF-8 charset, named', '/v1/agents', { method: 'POST', body: '{"name":"utf8-named","model":"default"}', headers: { 'content-type': 'application/json; charset=UTF-8', 'content-encoding': 'identity' } }, 201, ''],
    ];
    for (const [what, path, init, status, type] of cases) {
      const r = await fetch(`${p.baseUrl}${path}`, {
        ...init,
        headers: { authorization: `Bearer ${p.bootstrap.root_key}`, 'service-version': '2026-08-27', ...(init.headers as Record<string, string> | undefined) },
      });
      const body = (await r.json()) as unknown;
      if (status < 300) {
        expect(r.status, what).toBe(status);
        continue;
      }
      expect([r.status, errType(body)], what).toEqual([status, type]);
      expect(CATALOG[errType(body) ?? '']).toBe(r.status);
    }
    // The MCP edge reads its messages the same way: a JSON-RPC parse error carrying the wire error.
    const mcp = await fetch(`${p.baseUrl}/v1/mcp`, {
      method: 'POST',
      body: `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"x","arguments":{"a":${'['.repeat(5000)}${']'.repeat(5000)}}}}`,
      headers: { authorization: `Bearer ${p.bootstrap.root_key}`, 'content-type': 'application/json', accept: 'application/json, text/event-stream', 'mcp-protocol-version': '2025-06-18' },
    });
    const rpc = (await mcp.json()) as { error?: { code?: number; data?: unknown } };
    expect([mcp.status, rpc.error?.code, errType(rpc.error?.data)]).toEqual([400, -32700, 'validation.malformed']);
  });
});
