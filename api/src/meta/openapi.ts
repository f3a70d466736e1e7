import type { TSchema } from '@agentplane/core';
import { CURRENT_VERSION, type Operation } from '../http/operation.js';

/** Strip TypeBox's symbol keys and internal markers: plain JSON Schema 2020-12 for OpenAPI 3.1. */
function plain(schema: TSchema): unknown {
  return JSON.parse(JSON.stringify(schema)) as unknown;
}

function parameters(op: Operation): unknown[] {
  const out: unknown[] = [];
  const add = (schema: TSchema | undefined, where: 'path' | 'query') => {
    const props = (schema as { properties?: Record<string, TSchema>; required?: string[] } | undefined)?.properties ?? {};
    const required = new Set((schema as { required?: string[] } | undefined)?.required ?? []);
    for (const [name, s] of Object.entries(props)) out.push({ name, in: where, required: where === 'path' || required.has(name), schema: plain(s) });
  };
  add(op.params, 'path');
  add(op.query, 'query');
  if (op.versions !== null) {
    out.push({ name: 'Service-Version', in: 'header', required: true, schema: { type: 'string', enum: [...(op.versions ?? [CURRENT_VERSION])] } });
  }
  if (op.idempotency && op.idempotency !== 'none') {
    out.push({ name: 'Idempotency-Key', in: 'header', required: op.idempotency === 'required', schema: { type: 'string', minLength: 1, maxLength: 255, pattern: '^[\\x21-\\x7e]+$' } });
  }
  return out;
}

/** OpenAPI 3.1 generated from the same operation table and schemas the router validates with. */
export function openApiDocument(operations: readonly Operation[], serverUrl: string): unknown {
  const paths: Record<string, Record<string, unknown>> = {};
  for (const op of operations) {
    const item = (paths[op.path] ??= {});
    const errorRef = { $ref: '#/components/responses/Error' };
    item[op.method.toLowerCase()] = {
      operationId: op.operationId,
      summary: op.summary,
      tags: [op.operationId.split('.')[0]],
      security: op.auth.kind === 'none' ? [] : [{ bearer: [] }],
      parameters: parameters(op),
      ...(op.upload ? { requestBody: { required: true, content: { [op.upload.contentType]: { schema: plain(op.upload.schema) } } } } : {}),
      ...(op.body ? { requestBody: { required: true, content: { 'application/json': { schema: plain(op.body) } } } } : {}),
      responses: {
        [String(op.successStatus ?? 200)]: {
          description: 'Success',
          content: { [op.operationId.endsWith('Stream') ? 'text/event-stream' : 'application/json']: { schema: op.response ? plain(op.response) : {} } },
        },
        '400': errorRef, '401': errorRef, '403': errorRef, '404': errorRef, '409': errorRef, '413': errorRef, '429': errorRef, '500': errorRef,
      },
      'x-mcp': op.mcp ?? 'full',
    };
  }
  return {
    openapi: '3.1.0',
    info: { title: 'agentplane API', version: CURRENT_VERSION },
    servers: [{ url: serverUrl }],
    paths,
    components: {
      securitySchemes: { bearer: { type: 'http', scheme: 'bearer' } },
      responses: {
        Error: {
          description: 'Wire error body',
          content: {
            'application/json': {
              schema: {
                type: 'object', required: ['error'],
                properties: { error: { type: 'object', required: ['type', 'message', 'more'], properties: { type: { type: 'string' }, message: { type: 'string' }, more: { type: 'string', format: 'uri' } } } },
              },
            },
          },
        },
      },
    },
  };
}
