import { Id, Obj, Page, PageQuery, Type, Patch } from '@agentplane/core';
import { tags } from '@agentplane/store';
import { ADMINS, READERS } from '../http/caller.js';
import { createOnce } from '../http/keyed-create.js';
import { defineOperation, json, type Operation } from '../http/operation.js';
import { workspaceRead, workspaceWrite } from '../http/workspace-operation.js';
import { requireWorkspace } from '../http/workspace-scope.js';
import type { ApiDeps } from '../deps.js';
import type { Connection } from '@agentplane/domain';
import { checkConnectionFields, ConnectionAuthInput, ConnectionName, ConnectionSchema, ConnectionUrl, view } from './schemas.js';
import { ConnectionService } from '@agentplane/domain';
import { checkConnectionUrl } from './url.js';

const ConnPath = Obj({ connection_id: Id('connection') });
const service = (deps: ApiDeps) => new ConnectionService(deps.docs, deps.secretBox);

export const connectionOperations: Operation[] = [
  workspaceWrite('POST', {
    operationId: 'connections.createConnection', path: '/v1/connections',
    audit: { target: 'response' },
    summary: 'Configure an external MCP server (Streamable HTTP) for the Workspace; an upstream bearer is stored sealed',
    auth: { kind: 'bearer', roles: ADMINS },
    body: Obj({ name: ConnectionName, url: ConnectionUrl, auth: Type.Optional(ConnectionAuthInput) }),
    response: ConnectionSchema, successStatus: 201, idempotency: 'optional',
    // Accepts a credential: REST-only.
    mcp: 'never',
  }, async (ws, { body, deps, keyed }) => {
    checkConnectionFields(body);
    checkConnectionUrl(body.url, deps.config.webhooks.egress);
    return view(await createOnce('connection', keyed, (id) => service(deps).find(ws, id), (id) => service(deps).create(ws, body, id), 'connection-created'));
  }),
  workspaceRead({
    operationId: 'connections.listConnections', path: '/v1/connections',
    summary: 'List the Connections of the Workspace', auth: { kind: 'bearer', roles: READERS },
    query: PageQuery({ status: Type.Optional(Type.Union([Type.Literal('active'), Type.Literal('archived')])) }),
    response: Page(ConnectionSchema), mcp: 'full',
  }, async (ws, { query, deps }) => {
    const page = await deps.docs.list<Connection>(tags.workspace(ws), 'connections', { limit: query.limit ?? 20, page: query.page, order: 'asc' },
      (c) => query.status === undefined || c.status === query.status);
    return { data: page.data.map(view), next_page: page.next_page };
  }),
  workspaceRead({
    operationId: 'connections.getConnection', path: '/v1/connections/{connection_id}',
    summary: 'Read a Connection (never its secret)', auth: { kind: 'bearer', roles: READERS }, params: ConnPath,
    response: ConnectionSchema, mcp: 'full',
  }, async (ws, { params, deps }) => view(await service(deps).get(ws, params.connection_id))),
  defineOperation({
    operationId: 'connections.updateConnection', method: 'PATCH', path: '/v1/connections/{connection_id}',
    audit: { target: 'connection_id' },
    summary: 'Rename, re-point, re-key, archive or restore a Connection', auth: { kind: 'bearer', roles: ADMINS }, params: ConnPath,
    body: Patch({
      expected_version: Type.Optional(Type.Integer({ minimum: 1 })),
      name: Type.Optional(ConnectionName),
      url: Type.Optional(ConnectionUrl),
      auth: Type.Optional(ConnectionAuthInput),
      status: Type.Optional(Type.Union([Type.Literal('active'), Type.Literal('archived')])),
    }),
    response: ConnectionSchema,
    // May accept a credential: REST-only.
    mcp: 'never',
    async handler({ caller, params, body, deps }) {
      const { expected_version, ...patch } = body;
      checkConnectionFields(patch);
      if (patch.url !== undefined) checkConnectionUrl(patch.url, deps.config.webhooks.egress);
      return json(200, view(await service(deps).update(requireWorkspace(caller), params.connection_id, patch, expected_version)));
    },
  }),
];
