import { ERROR_STATUS, type ErrorType, type TSchema } from '@agentplane/core';
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

/** Statuses whose responses carry no body (RFC 9110): their OpenAPI response has no `content`. */
const BODILESS = new Set([204, 205, 304]);

function successResponse(op: Operation): Record<string, unknown> {
  const status = op.successStatus ?? 200;
  if (BODILESS.has(status)) return { description: 'Success, no body' };
  const type = op.operationId.endsWith('Stream') ? 'text/event-stream' : 'application/json';
  return { description: 'Success', content: { [type]: { schema: op.response ? plain(op.response) : {} } } };
}

/** The catalog's error types grouped by HTTP status: one declared error response per status. */
function errorTypesByStatus(): Map<number, ErrorType[]> {
  const out = new Map<number, ErrorType[]>();
  for (const [type, status] of Object.entries(ERROR_STATUS) as Array<[ErrorType, number]>) out.set(status, [...(out.get(status) ?? []), type]);
  return new Map([...out].sort(([a], [b]) => a - b));
}

function errorResponse(types: readonly ErrorType[]): unknown {
  return {
    description: `Wire error body; \`error.type\` is one of ${types.map((t) => `\`${t}\``).join(', ')}`,
    content: {
      'application/json': {
        schema: {
          type: 'object', required: ['error'],
          properties: {
            error: {
              type: 'object', required: ['type', 'message', 'more'],
              properties: { type: { type: 'string', enum: [...types] }, message: { type: 'string' }, more: { type: 'string', format: 'uri' } },
            },
          },
        },
      },
    },
  };
}

/** OpenAPI 3.1 generated from the same operation table and schemas the router validates with. */
export function openApiDocument(operations: readonly Operation[], serverUrl: string): unknown {
  const paths: Record<string, Record<string, unknown>> = {};
  const byStatus = errorTypesByStatus();
  for (const op of operations) {
    const item = (paths[op.path] ??= {});
    const errors = Object.fromEntries([...byStatus.keys()].map((status) => [String(status), { $ref: `#/components/responses/Error${status}` }]));
    item[op.method.toLowerCase()] = {
      operationId: op.operationId,
      summary: op.summary,
      tags: [op.operationId.split('.')[0]],
      security: op.auth.kind === 'none' ? [] : [{ bearer: [] }],
      parameters: parameters(op),
      ...(op.upload ? { requestBody: { required: true, content: { [op.upload.contentType]: { schema: plain(op.upload.schema) } } } } : {}),
      ...(op.body ? { requestBody: { required: true, content: { 'application/json': { schema: plain(op.body) } } } } : {}),
      responses: {
        [String(op.successStatus ?? 200)]: successResponse(op),
        ...errors,
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
      responses: Object.fromEntries([...byStatus].map(([status, types]) => [`Error${status}`, errorResponse(types)])),
    },
  };
}
