import { request } from 'node:http';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startPlatform, type Platform } from './harness/platform.js';

/**
 * Black-box checks of the wire contract's Idempotency-Key and request-body rules at their edges:
 * where a key's record lives (an organization operation is the organization's, whichever
 * Workspace the key selects), which refusals a key keeps (not a 429, whose limit clears), and
 * what a body's bytes must be (UTF-8 JSON text, never read with replacement characters).
 */

let p: Platform;
let org: string;
let ws: string;
let other: string;

type Json = Record<string, unknown>;
interface Answer {
  status: number;
  body: Json;
  replayed: string | null;
}

const errType = (a: Answer) => (a.body.error as { type?: string } | undefined)?.type;

async function call(method: string, path: string, body?: unknown, headers: Record<string, string> = {}): Promise<Answer> {
  const r = await fetch(`${p.baseUrl}${path}`, {
    method,
    ...(body !== undefined ? { body: JSON.stringify(body) } : {}),
    headers: {
      authorization: `Bearer ${p.bootstrap.root_key}`, 'service-version': '2026-08-27',
      ...(body !== undefined ? { 'content-type': 'application/json' } : {}), ...headers,
    },
  });
  return { status: r.status, body: (await r.json()) as Json, replayed: r.headers.get('idempotent-replayed') };
}

/** A POST whose body is exactly these bytes; `chunked` sends them in pieces (the body is read as it streams in). */
function rawPost(path: string, bytes: Buffer, chunked = false): Promise<Answer> {
  return new Promise((resolve, reject) => {
    const req = request({
      host: '127.0.0.1', port: p.port, method: 'POST', path,
      headers: {
        authorization: `Bearer ${p.bootstrap.root_key}`, 'service-version': '2026-08-27', 'content-type': 'application/json',
        ...(chunked ? { 'transfer-encoding': 'chunked' } : { 'content-length': String(bytes.length) }),
      },
    }, (res) => {
      const chunks: Buffer[] = [];
      res.on('data', (c: Buffer) => chunks.push(c));
      res.on('end', () => resolve({ status: res.statusCode ?? 0, body: JSON.parse(Buffer.concat(chunks).toString('utf8')) as Json, replayed: null }));
      res.on('error', reject);
    });
    req.on('error', reject);
    if (chunked) {
      // Split inside the multi-byte sequences too: a valid one must survive being cut.
      for (let at = 0; at < bytes.length; at += 3) req.write(bytes.subarray(at, at + 3));
      req.end();
    } else {
      req.end(bytes);
    }
  });
}

beforeAll(async () => {
  p = await startPlatform();
  org = p.bootstrap.organization_id;
  ws = p.bootstrap.workspace_id;
  const made = await call('POST', `/v1/organizations/${org}/workspaces`, { name: 'idempotency-other' }, { 'idempotency-key': 'scope-other-ws' });
  expect(made.status).toBe(201);
  other = String(made.body.id);
});
afterAll(async () => {
  await p?.stop();
});

describe('Idempotency-Key scope', () => {
  it("an organization operation's key is the organization's: a retry selecting another Workspace replays, nothing is made twice", async () => {
    const keyBody = { display_name: 'scoped-key', role: 'viewer', scope: { type: 'workspace', workspace_id: ws } };
    const first = await call('POST', `/v1/organizations/${org}/api-keys`, keyBody, { 'idempotency-key': 'scope-api-key' });
    expect(first.status).toBe(201);
    for (const selected of [ws, other]) {
      const again = await call('POST', `/v1/organizations/${org}/api-keys`, keyBody, { 'idempotency-key': 'scope-api-key', 'service-workspace-id': selected });
      expect([selected, again.status, again.replayed, again.body.id, again.body.secret]).toEqual([selected, 201, 'true', first.body.id, first.body.secret]);
    }
    const keys = await call('GET', `/v1/organizations/${org}/api-keys?limit=100`);
    expect((keys.body.data as Json[]).filter((k) => k.display_name === 'scoped-key')).toHaveLength(1);

    // A rotation retried with another Workspace selected is the same rotation: one new generation, one secret.
    const rotate = (selected: string) => call('POST', `/v1/api-keys/${String(first.body.id)}/rotate`, {}, { 'idempotency-key': 'scope-rotate', 'service-workspace-id': selected });
    const rotated = await rotate(ws);
    expect(rotated.status).toBe(200);
    const retried = await rotate(other);
    expect([retried.status, retried.replayed, retried.body.secret, retried.body.generation_number]).toEqual([200, 'true', rotated.body.secret, rotated.body.generation_number]);
    expect((await call('GET', `/v1/api-keys/${String(first.body.id)}`)).body.generation_number).toBe(rotated.body.generation_number);

    const wsBody = { name: 'scoped-workspace' };
    const made = await call('POST', `/v1/organizations/${org}/workspaces`, wsBody, { 'idempotency-key': 'scope-workspace' });
    expect(made.status).toBe(201);
    const remade = await call('POST', `/v1/organizations/${org}/workspaces`, wsBody, { 'idempotency-key': 'scope-workspace', 'service-workspace-id': other });
    expect([remade.status, remade.replayed, remade.body.id]).toEqual([201, 'true', made.body.id]);
    const workspaces = await call('GET', `/v1/organizations/${org}/workspaces?limit=100`);
    expect((workspaces.body.data as Json[]).filter((w) => w.name === 'scoped-workspace')).toHaveLength(1);
  });

  it("a Workspace operation's key stays the Workspace's: the same key makes one resource in each", async () => {
    const body = { name: 'scoped-agent', model: 'default' };
    const here = await call('POST', '/v1/agents', body, { 'idempotency-key': 'scope-agent' });
    const there = await call('POST', '/v1/agents', body, { 'idempotency-key': 'scope-agent', 'service-workspace-id': other });
    expect([here.status, here.replayed, there.status, there.replayed]).toEqual([201, null, 201, null]);
    expect([here.body.workspace_id, there.body.workspace_id]).toEqual([ws, other]);
    const replay = await call('POST', '/v1/agents', body, { 'idempotency-key': 'scope-agent', 'service-workspace-id': other });
    expect([replay.status, replay.replayed, replay.body.id]).toEqual([201, 'true', there.body.id]);
  });
});

describe('Idempotency-Key and a limit that clears', () => {
  it('a keyed drive refused with 429 for a spent budget runs, under the same key, once the budget is raised', async () => {
    const principal = await call('POST', `/v1/organizations/workspaces/${ws}/principals`, { external_subject_id: 'budget-retry', principal_type: 'person', display_name: 'Budget Retry' });
    const agent = await call('POST', '/v1/agents', { name: 'budget-retry', model: 'default' });
    const env = await call('POST', '/v1/environments', { name: 'budget-retry', image: 'agentplane/sandbox:1' });
    const session = await call('POST', '/v1/sessions', { agent: agent.body.id, environment_id: env.body.id, budget: { max_list_cost: { amount: 0 } } });
    expect([principal.status, agent.status, env.status, session.status]).toEqual([201, 201, 201, 201]);
    const events = `/v1/sessions/${String(session.body.id)}/events`;
    const message = { type: 'user.message', payload: { content: 'one more, please', authored_by: principal.body.id, caused_by: { kind: 'api' } } };
    const key = { 'idempotency-key': 'budget-retry-1' };

    const refused = await call('POST', events, message, key);
    expect([refused.status, errType(refused)]).toEqual([429, 'budget.exceeded']);
    // Still spent: refused again, by the budget itself (not a stored answer).
    const still = await call('POST', events, message, key);
    expect([still.status, errType(still), still.replayed]).toEqual([429, 'budget.exceeded', null]);

    const raised = await call('POST', `/v1/sessions/${String(session.body.id)}`, { budget: { max_list_cost: { amount: 5 } } });
    expect(raised.status).toBe(200);
    const admitted = await call('POST', events, message, key);
    expect([admitted.status, admitted.replayed, admitted.body.type]).toEqual([201, null, 'user.message']);
    // From now on the key replays that answer: one message in the log.
    const replayed = await call('POST', events, message, key);
    expect([replayed.status, replayed.replayed, replayed.body.id]).toEqual([201, 'true', admitted.body.id]);
    const threads = await call('GET', `/v1/sessions/${String(session.body.id)}/threads`);
    const primary = String((threads.body.data as Json[])[0]?.id);
    const log = await call('GET', `/v1/sessions/${String(session.body.id)}/threads/${primary}/events?limit=100`);
    expect((log.body.data as Json[]).filter((e) => e.type === 'user.message').map((e) => e.id)).toEqual([admitted.body.id]);
  });
});

describe('request bodies are UTF-8 JSON text', () => {
  const agentBody = (name: Buffer) => Buffer.concat([Buffer.from('{"name":"'), name, Buffer.from('","model":"default"}')]);
  const agentsNamed = async (prefix: string) =>
    ((await call('GET', '/v1/agents?limit=100')).body.data as Json[]).filter((a) => String(a.name).startsWith(prefix)).length;

  it('a body whose bytes are not UTF-8 is a 400 and makes nothing, read whole or as it streams in', async () => {
    const before = await agentsNamed('utf8-');
    const invalid: Array<[string, Buffer]> = [
      ['a lone 0xFF byte', Buffer.from([0xff])],
      ['a lone continuation byte', Buffer.from([0x80])],
      ['an overlong slash', Buffer.from([0xc0, 0xaf])],
      ['an encoded surrogate', Buffer.from([0xed, 0xa0, 0x80])],
      ['a cut sequence', Buffer.from([0xe2, 0x82])],
    ];
    for (const [what, bytes] of invalid) {
      for (const chunked of [false, true]) {
        const a = await rawPost('/v1/agents', agentBody(Buffer.concat([Buffer.from('utf8-'), bytes])), chunked);
        expect([what, chunked, a.status, errType(a)]).toEqual([what, chunked, 400, 'validation.malformed']);
        expect(String((a.body.error as Json).message)).toContain('UTF-8');
      }
    }
    expect(await agentsNamed('utf8-')).toBe(before);
  });

  it('well-formed UTF-8 is stored as sent, and a leading byte order mark is ignored', async () => {
    const name = 'utf8-caf\u00e9-\u{1f600}';
    for (const chunked of [false, true]) {
      const a = await rawPost('/v1/agents', agentBody(Buffer.from(`${name}-${String(chunked)}`, 'utf8')), chunked);
      expect([a.status, a.body.name]).toEqual([201, `${name}-${String(chunked)}`]);
    }
    const bom = await rawPost('/v1/agents', Buffer.concat([Buffer.from([0xef, 0xbb, 0xbf]), agentBody(Buffer.from('utf8-bom'))]));
    expect([bom.status, bom.body.name]).toEqual([201, 'utf8-bom']);
  });
});
