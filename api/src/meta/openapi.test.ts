import { describe, expect, it } from 'vitest';
import { Id, Obj, Type } from '@agentplane/core';
import { READERS } from '../http/caller.js';
import { defineOperation, json, type Operation } from '../http/operation.js';
import { allOperations } from '../routes.js';
import { openApiDocument } from './openapi.js';

type Responses = Record<string, { content?: Record<string, unknown> }>;
type Doc = { paths: Record<string, Record<string, { responses: Responses }>> };

const op = (o: Partial<Operation> & Pick<Operation, 'operationId' | 'method' | 'path'>): Operation =>
  defineOperation({ summary: o.operationId, auth: { kind: 'bearer', roles: READERS }, handler: async () => json(200, {}), ...o } as Operation);

function successResponses(doc: Doc): Array<{ where: string; status: string; content: unknown }> {
  const out: Array<{ where: string; status: string; content: unknown }> = [];
  for (const [path, item] of Object.entries(doc.paths)) {
    for (const [method, operation] of Object.entries(item)) {
      for (const [status, response] of Object.entries(operation.responses)) {
        if (status.startsWith('2')) out.push({ where: `${method.toUpperCase()} ${path}`, status, content: response.content });
      }
    }
  }
  return out;
}

describe('openApiDocument', () => {
  it('declares no body on a 204 response, and the schema on a 200 one', () => {
    const doc = openApiDocument([
      op({ operationId: 'widgets.deleteWidget', method: 'DELETE', path: '/v1/widgets/{id}', params: Obj({ id: Id('file') }), successStatus: 204 }),
      op({ operationId: 'widgets.getWidget', method: 'GET', path: '/v1/widgets/{id}', params: Obj({ id: Id('file') }), response: Obj({ name: Type.String() }) }),
    ], 'http://127.0.0.1') as Doc;
    const responses = successResponses(doc);
    expect(responses.find((r) => r.where === 'DELETE /v1/widgets/{id}')).toEqual({ where: 'DELETE /v1/widgets/{id}', status: '204', content: undefined });
    const get = responses.find((r) => r.where === 'GET /v1/widgets/{id}');
    expect(get?.status).toBe('200');
    expect(get?.content).toMatchObject({ 'application/json': { schema: { type: 'object', required: ['name'] } } });
  });

  it('of the whole operation table: no 204 response declares content', () => {
    const doc = openApiDocument(allOperations(), 'http://127.0.0.1') as Doc;
    const responses = successResponses(doc);
    expect(responses.length).toBeGreaterThan(50);
    expect(responses.filter((r) => r.status === '204' && r.content !== undefined)).toEqual([]);
  });
});
