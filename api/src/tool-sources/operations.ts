import { Id, Nullable, Obj, Page, PageQuery, Timestamp, Type } from '@agentplane/core';
import { ADMINS, READERS } from '../http/caller.js';
import { createOnce } from '../http/keyed-create.js';
import { defineOperation, json, type Operation } from '../http/operation.js';
import { pageOf, workspaceRead, workspaceWrite } from '../http/workspace-operation.js';
import { requireWorkspace } from '../http/workspace-scope.js';

const readers = { kind: 'bearer', roles: READERS } as const;
const admins = { kind: 'bearer', roles: ADMINS } as const;

const HttpUrl = Type.String({ minLength: 8, maxLength: 2048, pattern: '^https?://[^\\s]+$' });
const B64u = Type.String({ minLength: 1, maxLength: 128, pattern: '^[A-Za-z0-9_-]+$' });

export const VerificationKeySchema = Obj({
  kty: Type.Literal('EC'), crv: Type.Literal('P-256'), x: B64u, y: B64u,
  kid: Type.String({ minLength: 1, maxLength: 200 }), alg: Type.Literal('ES256'),
}, { description: 'An ES256 public JWK; private members are not accepted' });

const SourceInput = Obj({
  kind: Type.Literal('a2a'),
  card_url: HttpUrl,
  verification_keys: Type.Array(VerificationKeySchema, { minItems: 1, maxItems: 8 }),
});

export const ProviderPackageSchema = Obj({
  id: Id('providerPackage'),
  type: Type.Literal('provider_package'),
  workspace_id: Id('workspace'),
  name: Type.String(),
  package_version: Type.Integer({ minimum: 1 }),
  origin: Type.String(),
  egress: Type.Array(Obj({ method: Type.Union([Type.Literal('GET'), Type.Literal('POST')]), url: Type.String() })),
  digest: Type.String(),
  reviewed_by: Type.String(),
  review_note: Nullable(Type.String()),
  version: Type.Integer({ minimum: 1 }),
  created_at: Timestamp(),
  updated_at: Timestamp(),
});

const Security = Type.Union([
  Obj({ kind: Type.Literal('bearer'), scheme_name: Type.String() }),
  Obj({ kind: Type.Literal('oauth2_authorization_code'), scheme_name: Type.String(), scopes: Type.Array(Type.String()), authorization_url: Type.String(), token_url: Type.String() }),
  Obj({ kind: Type.Literal('mtls'), scheme_name: Type.String() }),
]);

export const ToolSourceSchema = Obj({
  id: Id('toolSource'),
  type: Type.Literal('tool_source'),
  workspace_id: Id('workspace'),
  name: Type.String(),
  provider: Type.String(),
  provider_package: Obj({ id: Id('providerPackage'), package_version: Type.Integer(), digest: Type.String() }),
  source: Obj({ kind: Type.Literal('a2a'), card_url: Type.String(), verification_keys: Type.Array(VerificationKeySchema) }),
  revision: Type.Integer({ minimum: 1 }),
  sync: Obj({
    state: Type.Union([Type.Literal('pending'), Type.Literal('synced'), Type.Literal('rejected')]),
    checked_at: Nullable(Timestamp()),
    rejection: Nullable(Obj({ reason: Type.String(), detail: Type.String() })),
  }),
  discovery: Nullable(Obj({
    card_digest: Type.String(),
    key_id: Type.String(),
    agent_name: Type.String(),
    agent_version: Type.String(),
    interface: Obj({ url: Type.String(), protocol_binding: Type.Literal('JSONRPC'), protocol_version: Type.String() }),
    streaming: Type.Boolean(),
    push_notifications: Type.Boolean(),
    security: Security,
  })),
  tools: Type.Array(Obj({ name: Type.String(), skill_id: Type.String(), description: Type.String(), approval: Type.Literal('always_ask') })),
  migration: Type.Optional(Nullable(Obj({
    revision: Type.Integer({ minimum: 1 }),
    state: Type.Union([Type.Literal('running'), Type.Literal('completed')]),
    started_at: Timestamp(),
    completed_at: Nullable(Timestamp()),
  }, { description: 'Migration of the dependent Connections to the latest revision' }))),
  version: Type.Integer({ minimum: 1 }),
  created_at: Timestamp(),
  updated_at: Timestamp(),
});

export const ToolSourceConnectionSchema = Obj({
  id: Id('connection'),
  type: Type.Literal('connection'),
  workspace_id: Id('workspace'),
  name: Type.String(),
  kind: Type.Literal('a2a_tool_source'),
  tool_source_id: Id('toolSource'),
  source_revision: Type.Integer({ minimum: 1 }),
  provider_package: Obj({ id: Id('providerPackage'), package_version: Type.Integer(), digest: Type.String() }),
  status: Type.Literal('active'),
  archived_at: Type.Null(),
  version: Type.Integer({ minimum: 1 }),
  created_at: Timestamp(),
  updated_at: Timestamp(),
});

const PackagePath = Obj({ provider_package_id: Id('providerPackage') });
const SourcePath = Obj({ tool_source_id: Id('toolSource') });
const Name = Type.String({ minLength: 1, maxLength: 100, pattern: '^[A-Za-z0-9][A-Za-z0-9_.-]*$' });

/** Provider packages and external A2A tool sources (docs/A2A_TOOLS.md). */
export const toolSourceOperations: Operation[] = [
  defineOperation({
    operationId: 'toolSources.publishProviderPackage', method: 'POST', path: '/v1/provider-packages',
    summary: 'Publish a reviewed provider package: an immutable version naming the egress ceiling (one card GET, one JSON-RPC POST, one origin)',
    audit: { target: 'response' }, auth: admins, idempotency: 'optional', mcp: 'full', successStatus: 201,
    body: Obj({
      name: Name,
      package_version: Type.Integer({ minimum: 1, maximum: 1_000_000 }),
      card_url: HttpUrl,
      rpc_url: HttpUrl,
      review_note: Type.Optional(Type.String({ maxLength: 2000 })),
    }),
    response: ProviderPackageSchema,
    async handler({ caller, body, deps }) {
      return json(201, await deps.toolSources.publishPackage(requireWorkspace(caller), caller.credentialId, body));
    },
  }),
  workspaceRead({
    operationId: 'toolSources.listProviderPackages', path: '/v1/provider-packages', summary: 'List the reviewed provider packages of the Workspace',
    auth: readers, query: PageQuery({}), response: Page(ProviderPackageSchema), mcp: 'full',
  }, (ws, { query, deps }) => deps.toolSources.listPackages(ws, pageOf(query))),
  workspaceRead({
    operationId: 'toolSources.getProviderPackage', path: '/v1/provider-packages/{provider_package_id}', summary: 'Read a provider package',
    auth: readers, params: PackagePath, response: ProviderPackageSchema, mcp: 'full',
  }, (ws, { params, deps }) => deps.toolSources.getPackage(ws, params.provider_package_id)),
  workspaceWrite('POST', {
    operationId: 'toolSources.createToolSource', path: '/v1/tool-sources',
    summary: 'Register an external A2A agent as a tool source under a reviewed provider package',
    audit: { target: 'response' }, auth: admins, idempotency: 'optional', mcp: 'full', successStatus: 201,
    body: Obj({
      name: Name,
      provider: Name,
      provider_package_version: Type.Optional(Type.Integer({ minimum: 1 })),
      source: SourceInput,
    }),
    response: ToolSourceSchema,
  }, (ws, { body, deps, keyed }) => createOnce('toolSource', keyed, (id) => deps.toolSources.findSource(ws, id), (id) => deps.toolSources.createSource(ws, body, id), 'tool-source-created')),
  workspaceRead({
    operationId: 'toolSources.listToolSources', path: '/v1/tool-sources', summary: 'List the tool sources of the Workspace',
    auth: readers, query: PageQuery({}), response: Page(ToolSourceSchema), mcp: 'full',
  }, (ws, { query, deps }) => deps.toolSources.listSources(ws, pageOf(query))),
  workspaceRead({
    operationId: 'toolSources.getToolSource', path: '/v1/tool-sources/{tool_source_id}', summary: 'Read a tool source, its discovery and its always-ask tools',
    auth: readers, params: SourcePath, response: ToolSourceSchema, mcp: 'full',
  }, (ws, { params, deps }) => deps.toolSources.getSource(ws, params.tool_source_id)),
  workspaceWrite('POST', {
    operationId: 'toolSources.syncToolSource', path: '/v1/tool-sources/{tool_source_id}/sync',
    summary: 'Fetch the agent card (credential-free GET), verify its signature and publish its skills as always-ask tools',
    audit: { target: 'tool_source_id' }, auth: admins, params: SourcePath, mcp: 'full', successStatus: 200,
    response: ToolSourceSchema,
  }, (ws, { params, deps }) => deps.toolSources.sync(ws, params.tool_source_id)),
  workspaceWrite('POST', {
    operationId: 'toolSources.rotateToolSource', path: '/v1/tool-sources/{tool_source_id}/source-revisions',
    summary: 'Rotate trust: publish a candidate source under a higher, compatible provider package once its card verifies (credential-free card GET only)',
    audit: { target: 'tool_source_id' }, auth: admins, params: SourcePath, idempotency: 'required', mcp: 'full', successStatus: 201,
    body: Obj({
      expected_version: Type.Optional(Type.Integer({ minimum: 1 })),
      source: SourceInput,
      provider_package: Obj({ id: Id('providerPackage'), package_version: Type.Integer({ minimum: 1 }), digest: Type.String({ minLength: 1, maxLength: 100 }) }),
      dependent_connections: Type.Array(Obj({ id: Id('connection'), version: Type.Integer({ minimum: 1 }) }), { maxItems: 1000 }),
    }),
    response: ToolSourceSchema,
  }, (ws, { params, body, deps, keyed }) => deps.toolSources.rotate(ws, params.tool_source_id, body, keyed?.write('toolSource'))),
  workspaceWrite('POST', {
    operationId: 'toolSources.createToolSourceConnection', path: '/v1/tool-sources/{tool_source_id}/connections',
    summary: 'Create a Connection of kind a2a_tool_source, pinned to the source\'s current revision (a dependent that rotation migrates)',
    audit: { target: 'response' }, auth: admins, params: SourcePath, idempotency: 'optional', mcp: 'full', successStatus: 201,
    body: Obj({ name: Type.String({ minLength: 1, maxLength: 200 }) }),
    response: ToolSourceConnectionSchema,
  }, (ws, { params, body, deps, keyed }) =>
    // Made once per keyed request: the retry of a create that died after writing (crash point
    // `tool-source-connection-created`) is answered the Connection it wrote, not a second one.
    createOnce('connection', keyed, (id) => deps.toolSources.findConnection(ws, params.tool_source_id, id),
      (id) => deps.toolSources.createConnection(ws, params.tool_source_id, body, id), 'tool-source-connection-created')),
  workspaceRead({
    operationId: 'toolSources.listToolSourceConnections', path: '/v1/tool-sources/{tool_source_id}/connections',
    summary: 'List the Connections that depend on a tool source, with their versions and pinned revisions',
    auth: readers, params: SourcePath, query: PageQuery({}), response: Page(ToolSourceConnectionSchema), mcp: 'full',
  }, async (ws, { params, query, deps }) => {
    await deps.toolSources.getSource(ws, params.tool_source_id);
    return deps.toolSources.listConnections(ws, params.tool_source_id, pageOf(query));
  }),
];
