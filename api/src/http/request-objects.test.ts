import type Koa from 'koa';
import { describe, expect, it } from 'vitest';
import { ANONYMOUS } from './caller.js';
import { HandlerRequest, type RawRequest } from './pipeline.js';
import { RestRequest } from './router.js';
import type { ApiDeps } from '../deps.js';
import type { Operation } from './operation.js';

/** Own properties defined with a getter or a setter (none may be made per request: docs/RUNS.md, "Garbage"). */
const ownAccessors = (o: object): string[] =>
  Object.entries(Object.getOwnPropertyDescriptors(o)).filter(([, d]) => d.get !== undefined || d.set !== undefined).map(([k]) => k);

/**
 * A getter made per request kept the whole request alive through young-generation collections;
 * the objects every request makes keep their lazy parts as prototype getters instead.
 */
describe('per-request objects', () => {
  it('a REST request has no accessor of its own and makes its trace context only when asked', () => {
    let traced = 0;
    const ctx = {
      headers: { host: 'x', 'set-cookie': ['a', 'b'] },
      params: { session_id: 'ses_1' },
      querystring: 'limit=2',
      query: { limit: '2' },
      req: { socket: {} },
      state: { trace: () => (traced++, { marker: 'trace' }) },
    } as unknown as Koa.Context;
    const raw = new RestRequest(ctx, 'GET', undefined, 'req_1', false);
    expect(ownAccessors(raw)).toEqual([]);
    expect(traced).toBe(0);
    expect(raw.trace).toEqual({ marker: 'trace' });
    expect(traced).toBe(1);
    expect(raw.headers['set-cookie']).toBe('a, b');
    expect(raw.params).toEqual({ session_id: 'ses_1' });
    expect(raw.query).toEqual({ limit: '2' });
    expect(raw.stream).toBeUndefined();
    expect(new RestRequest(ctx, 'POST', undefined, 'req_2', true).stream).toBe(ctx.req);
  });

  it("a handler's request has no accessor of its own and makes its logger once, when first used", () => {
    let children = 0;
    const log = { child: (b: Record<string, unknown>) => (children++, { bindings: b }) };
    const raw = { method: 'GET', headers: {}, params: {}, query: {}, body: undefined, requestId: 'req_9', trace: undefined } satisfies RawRequest;
    const op = { operationId: 'x.get', method: 'GET', path: '/v1/x', auth: { kind: 'none' } } as unknown as Operation;
    const req = new HandlerRequest(op, ANONYMOUS, {}, {}, {}, raw, undefined, { log } as unknown as ApiDeps);
    expect(ownAccessors(req)).toEqual([]);
    expect(children).toBe(0);
    expect(req.log).toBe(req.log);
    expect(children).toBe(1);
    expect(req.log).toEqual({ bindings: { request_id: 'req_9' } });
    expect(req.requestId).toBe('req_9');
    expect(req.trace).toBeUndefined();
  });
});
