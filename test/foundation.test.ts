import { request as httpRequest } from 'node:http';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { HttpClient } from '@agentplane/client';
import { startPlatform, type Platform } from './harness/platform.js';

let p: Platform;
beforeAll(async () => {
  p = await startPlatform();
});
afterAll(async () => {
  await p?.stop();
});

const errType = (r: { body: unknown }) => (r.body as { error?: { type?: string } }).error?.type;

describe('wire conventions', () => {
  it('serves /healthz without auth or version header', async () => {
    const r = await fetch(`${p.baseUrl}/healthz`);
    expect(r.status).toBe(200);
  });

  it('401 auth.invalid_key without a bearer, with an unknown one', async () => {
    const r1 = await p.anon.request('GET', '/v1/support/capabilities');
    expect(r1.status).toBe(401);
    expect(errType(r1)).toBe('auth.invalid_key');
    const r2 = await p.anon.with({ token: 'ap_key_nope-nope-nope' }).request('GET', '/v1/support/capabilities');
    expect(r2.status).toBe(401);
    expect(r2.body).toMatchObject({ error: { more: expect.stringMatching(/\/reference\/errors#auth-invalid-key$/) } });
  });

  it('400 validation.malformed for a missing or unsupported Service-Version', async () => {
    const r1 = await p.root.with({ version: null }).request('GET', '/v1/support/capabilities');
    expect(r1.status).toBe(400);
    expect(errType(r1)).toBe('validation.malformed');
    const r2 = await p.root.with({ version: '2020-01-01' }).request('GET', '/v1/support/capabilities');
    expect(r2.status).toBe(400);
  });

  it('names the workspace in Service-Workspace-Id', async () => {
    const r = await p.root.request('GET', '/v1/support/capabilities');
    expect(r.status).toBe(200);
    expect(r.headers.get('service-workspace-id')).toBe(p.bootstrap.workspace_id);
  });

  it('matches routes case-insensitively, with a trailing slash, for HEAD as GET, with path parameters decoded', async () => {
    const ws = p.bootstrap.workspace_id;
    const created = await p.root.post<{ id: string }>(`/v1/organizations/workspaces/${ws}/principals`, {
      external_subject_id: 'route-shapes', principal_type: 'service', display_name: 'Routes',
    });
    const get = (path: string, method = 'GET') => fetch(`${p.baseUrl}${path}`, {
      method, headers: { authorization: `Bearer ${p.bootstrap.root_key}`, 'service-version': '2026-08-27' },
    });
    for (const path of [`/v1/principals/${created.id}`, `/v1/principals/${created.id}/`, `/V1/Principals/${created.id}`]) {
      const r = await get(path);
      expect(r.status, path).toBe(200);
      expect(((await r.json()) as { id: string }).id).toBe(created.id);
    }
    // The id's characters percent-encoded: the parameter reaches the operation decoded.
    const encoded = [...created.id].map((c) => `%${c.charCodeAt(0).toString(16).padStart(2, '0')}`).join('');
    const r2 = await get(`/v1/principals/${encoded}`);
    expect(r2.status).toBe(200);
    expect(((await r2.json()) as { id: string }).id).toBe(created.id);
    const head = await get(`/v1/principals/${created.id}`, 'HEAD');
    expect(head.status).toBe(200);
    expect(await head.text()).toBe('');
    // Two trailing slashes name no route.
    const r3 = await get(`/v1/principals/${created.id}//`);
    expect(r3.status).toBe(404);
  });

  it('answers JSON with its status, type and byte length (non-ASCII text), and HEAD with the same headers and no body', async () => {
    const ws = p.bootstrap.workspace_id;
    const headers = { authorization: `Bearer ${p.bootstrap.root_key}`, 'service-version': '2026-08-27', 'content-type': 'application/json' };
    const created = await fetch(`${p.baseUrl}/v1/organizations/workspaces/${ws}/principals`, {
      method: 'POST', headers, body: JSON.stringify({ external_subject_id: 'json-shape', principal_type: 'service', display_name: 'Zoë 🚀 名前' }),
    });
    expect(created.status).toBe(201);
    expect(created.headers.get('content-type')).toBe('application/json; charset=utf-8');
    expect(created.headers.get('request-id')).toMatch(/^req_/);
    const createdBytes = Buffer.from(await created.arrayBuffer());
    expect(Number(created.headers.get('content-length'))).toBe(createdBytes.length);
    const { id } = JSON.parse(createdBytes.toString('utf8')) as { id: string };
    const get = await fetch(`${p.baseUrl}/v1/principals/${id}`, { headers });
    const bytes = Buffer.from(await get.arrayBuffer());
    expect(get.status).toBe(200);
    expect(Number(get.headers.get('content-length'))).toBe(bytes.length);
    expect((JSON.parse(bytes.toString('utf8')) as { display_name: string }).display_name).toBe('Zoë 🚀 名前');
    expect(get.headers.get('service-workspace-id')).toBe(ws);
    const head = await fetch(`${p.baseUrl}/v1/principals/${id}`, { method: 'HEAD', headers });
    expect(head.status).toBe(200);
    expect(head.headers.get('content-type')).toBe('application/json; charset=utf-8');
    expect(Number(head.headers.get('content-length'))).toBe(bytes.length);
    expect((await head.arrayBuffer()).byteLength).toBe(0);
    // Errors keep their own shape.
    const missing = await fetch(`${p.baseUrl}/v1/principals/prin_${'0'.repeat(32)}`, { headers });
    expect(missing.status).toBe(404);
    expect(missing.headers.get('content-type')).toBe('application/json; charset=utf-8');
    expect(((await missing.json()) as { error: { type: string } }).error.type).toBe('validation.not_found');
  });

  it('reads a body sent whole, sent chunked, or trickled in pieces; refuses JSON it cannot parse', async () => {
    const path = `/v1/organizations/workspaces/${p.bootstrap.workspace_id}/principals`;
    const send = (chunks: string[], headers: Record<string, string>, method = 'POST', to = path): Promise<{ status: number; body: { id?: string; error?: { type: string } } }> =>
      new Promise((resolve, reject) => {
        const url = new URL(p.baseUrl);
        const req = httpRequest({
          host: url.hostname, port: url.port, method, path: to,
          headers: { authorization: `Bearer ${p.bootstrap.root_key}`, 'service-version': '2026-08-27', 'content-type': 'application/json', ...headers },
        }, (res) => {
          let text = '';
          res.setEncoding('utf8');
          res.on('data', (c: string) => (text += c));
          res.on('end', () => resolve({ status: res.statusCode ?? 0, body: JSON.parse(text) as { id?: string; error?: { type: string } } }));
        });
        req.on('error', reject);
        // The pieces go in separate writes (whether the server reads them together or apart, the body is the same).
        const next = (i: number): void => {
          if (i === chunks.length - 1) return void req.end(chunks[i]);
          req.write(chunks[i]);
          setImmediate(() => next(i + 1));
        };
        next(0);
      });
    const doc = (name: string) => JSON.stringify({ external_subject_id: name, principal_type: 'service', display_name: name });
    const whole = doc('body-whole');
    expect(await send([whole], { 'content-length': String(Buffer.byteLength(whole)) })).toMatchObject({ status: 201, body: { id: expect.stringMatching(/^prin_/) } });
    expect(await send([doc('body-chunked')], { 'transfer-encoding': 'chunked' })).toMatchObject({ status: 201 });
    const pieces = doc('body-pieces');
    expect(await send([pieces.slice(0, 10), pieces.slice(10, 30), pieces.slice(30)], { 'content-length': String(Buffer.byteLength(pieces)) })).toMatchObject({ status: 201 });
    const broken = '{"external_subject_id": "x", ';
    expect(await send([broken], { 'content-length': String(broken.length) })).toMatchObject({ status: 400, body: { error: { type: 'validation.malformed' } } });
    // A GET takes no body: one sent is refused (an empty object aside), not ignored.
    const stray = '{"unknown":1}';
    expect(await send([stray], { 'content-length': String(stray.length) }, 'GET')).toMatchObject({ status: 400, body: { error: { type: 'validation.malformed' } } });
    expect(await send(['{}'], { 'content-length': '2' }, 'GET')).toMatchObject({ status: 200 });
  });

  it('413 validation.payload_too_large over 4 MiB, after the bearer: recorded for a known caller, 401 for a bad key', async () => {
    const big = JSON.stringify({ display_name: 'x'.repeat(4 * 1024 * 1024 + 10) });
    const path = `/v1/organizations/workspaces/${p.bootstrap.workspace_id}/principals`;
    const r = await p.root.request('POST', path, { rawBody: big });
    expect(r.status).toBe(413);
    expect(errType(r)).toBe('validation.payload_too_large');
    expect(r.headers.get('service-workspace-id')).toBe(p.bootstrap.workspace_id);
    const audit = await p.root.post<{ data: { request_id: string; action: string; outcome: string; status: number | null }[] }>('/v1/audit/export', {});
    expect(audit.data.filter((x) => x.request_id === r.headers.get('request-id')).map((x) => [x.action, x.outcome, x.status])).toEqual([['principals.createPrincipal', 'failed', 413]]);
    const badKey = await new HttpClient({ baseUrl: p.baseUrl, token: 'ap_key_bad' }).request('POST', path, { rawBody: big });
    expect([badKey.status, errType(badKey)]).toEqual([401, 'auth.invalid_key']);
  });

  it('rejects unknown fields and wrong id prefixes', async () => {
    const ws = p.bootstrap.workspace_id;
    const r1 = await p.root.request('POST', `/v1/organizations/workspaces/${ws}/principals`, {
      body: { external_subject_id: 'u1', principal_type: 'person', display_name: 'U', surprise: 1 },
    });
    expect(r1.status).toBe(400);
    expect((r1.body as { error: { message: string } }).error.message).toContain('surprise');
    const r2 = await p.root.request('GET', `/v1/principals/sess_${'0'.repeat(32)}`);
    expect(r2.status).toBe(400);
  });

  it('idempotency: replay, conflict on another body', async () => {
    const ws = p.bootstrap.workspace_id;
    const path = `/v1/organizations/workspaces/${ws}/principals`;
    const body = { external_subject_id: 'idem-1', principal_type: 'service', display_name: 'Idem' };
    const a = await p.root.request('POST', path, { body, idempotencyKey: 'k-1' });
    expect(a.status).toBe(201);
    const b = await p.root.request('POST', path, { body, idempotencyKey: 'k-1' });
    expect(b.status).toBe(201);
    expect(b.body).toEqual(a.body);
    const c = await p.root.request('POST', path, { body: { ...body, display_name: 'Other' }, idempotencyKey: 'k-1' });
    expect(c.status).toBe(409);
    expect(errType(c)).toBe('idempotency.conflict');
  });

  it('API key lifecycle: create (secret once), use, rotate, revoke', async () => {
    const org = p.bootstrap.organization_id;
    const ws = p.bootstrap.workspace_id;
    const missing = await p.root.request('POST', `/v1/organizations/${org}/api-keys`, {
      body: { display_name: 'dev', role: 'developer', scope: { type: 'workspace', workspace_id: ws } },
    });
    expect(missing.status).toBe(400);
    const created = await p.root.request<{ id: string; secret: string }>('POST', `/v1/organizations/${org}/api-keys`, {
      body: { display_name: 'dev', role: 'viewer', scope: { type: 'workspace', workspace_id: ws } },
      idempotencyKey: 'key-create-1',
    });
    expect(created.status).toBe(201);
    const viewer = new HttpClient({ baseUrl: p.baseUrl, token: created.body.secret });
    expect((await viewer.request('GET', '/v1/support/capabilities')).status).toBe(200);
    const denied = await viewer.request('POST', `/v1/organizations/workspaces/${ws}/principals`, {
      body: { external_subject_id: 'v', principal_type: 'person', display_name: 'V' },
    });
    expect(denied.status).toBe(403);
    const sel = await viewer.request('GET', '/v1/support/capabilities', { headers: { 'service-workspace-id': ws } });
    expect(sel.status).toBe(400);
    // An organization key's selector must be a Workspace id: anything else is malformed, not absent.
    for (const selector of ['garbage', `prin_${'0'.repeat(32)}`]) {
      const bad = await p.root.request<{ error: { type: string } }>('GET', '/v1/support/capabilities', { headers: { 'service-workspace-id': selector } });
      expect([selector, bad.status, bad.body.error.type]).toEqual([selector, 400, 'validation.malformed']);
    }
    const absent = await p.root.request('GET', '/v1/support/capabilities', { headers: { 'service-workspace-id': `wrkspc_${'0'.repeat(32)}` } });
    expect(absent.status).toBe(404);
    const meta = await p.root.request<Record<string, unknown>>('GET', `/v1/api-keys/${created.body.id}`);
    expect(meta.body.secret).toBeUndefined();

    const rotated = await p.root.request<{ secret: string }>('POST', `/v1/api-keys/${created.body.id}/rotate`, { body: {}, idempotencyKey: 'rot-1' });
    expect(rotated.status).toBe(200);
    expect((await viewer.request('GET', '/v1/support/capabilities')).status).toBe(401);
    // The create replay now fails closed: that generation is no longer live.
    const replay = await p.root.request('POST', `/v1/organizations/${org}/api-keys`, {
      body: { display_name: 'dev', role: 'viewer', scope: { type: 'workspace', workspace_id: ws } },
      idempotencyKey: 'key-create-1',
    });
    expect(replay.status).toBe(409);
    expect(JSON.stringify(replay.body)).not.toContain('ap_key_');
    const v2 = new HttpClient({ baseUrl: p.baseUrl, token: rotated.body.secret });
    expect((await v2.request('GET', '/v1/support/capabilities')).status).toBe(200);
    await p.root.post(`/v1/api-keys/${created.body.id}/revoke`, {});
    expect((await v2.request('GET', '/v1/support/capabilities')).status).toBe(401);
  });
});
