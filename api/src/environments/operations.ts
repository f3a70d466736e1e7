import { ApiError, Id, Metadata, newId, nowIso, Nullable, Obj, Page, PageQuery, Timestamp, Type } from '@agentplane/core';
import { READERS, WRITERS } from '../http/caller.js';
import { defineOperation, json, type Operation } from '../http/operation.js';
import { pageOf, workspaceRead, workspaceWrite } from '../http/workspace-operation.js';
import { requireWorkspace } from '../http/workspace-scope.js';
import { AcpHarness, DEFAULT_RESOURCES, Driver, ImageReference, Network, Packages, Resources, ResourcesInput, Retention, Tier, Topology, withResources, type Environment } from '@agentplane/domain';
import { createVersioned } from '../http/keyed-create.js';


const ConfigFields = {
  name: Type.String({ minLength: 1, maxLength: 200 }),
  description: Type.Optional(Nullable(Type.String({ maxLength: 2048 }))),
  image: ImageReference(),
  driver: Type.Optional(Driver),
  tier: Type.Optional(Tier),
  resources: Type.Optional(ResourcesInput),
  network: Type.Optional(Network),
  retention_mode: Type.Optional(Retention),
  harness_topology: Type.Optional(Topology),
  /** A third-party ACP agent harness (docs/ACP.md); null or absent: the built-in loop. */
  harness: Type.Optional(Nullable(AcpHarness)),
  packages: Type.Optional(Packages),
  /** Opt-in browser observation (Chromium in the sandbox, the `browser_*` tools): docs/SANDBOX.md. */
  browser: Type.Optional(Type.Boolean()),
  metadata: Type.Optional(Metadata()),
};

const CreateBody = Obj(ConfigFields);
const UpdateBody = Obj(
  {
    expected_version: Type.Integer({ minimum: 1 }),
    name: Type.Optional(ConfigFields.name),
    description: ConfigFields.description,
    image: Type.Optional(ConfigFields.image),
    driver: ConfigFields.driver,
    tier: ConfigFields.tier,
    resources: ConfigFields.resources,
    network: ConfigFields.network,
    retention_mode: ConfigFields.retention_mode,
    harness_topology: ConfigFields.harness_topology,
    harness: ConfigFields.harness,
    packages: ConfigFields.packages,
    browser: ConfigFields.browser,
    metadata: ConfigFields.metadata,
  },
  { minProperties: 2 },
);

export const EnvironmentSchema = Obj({
  id: Id('environment'), type: Type.Literal('environment'), workspace_id: Id('workspace'), name: Type.String(),
  description: Nullable(Type.String()), image: Type.String(), driver: Driver, tier: Tier, resources: Resources, network: Network,
  retention_mode: Retention, harness_topology: Topology, harness: Nullable(AcpHarness), packages: Packages, browser: Type.Boolean(), metadata: Metadata(), version: Type.Integer({ minimum: 1 }),
  archived_at: Nullable(Timestamp()), created_at: Timestamp(), updated_at: Timestamp(),
});


/** Versions written before `harness_topology` (or `browser`) existed read as `split` (and no browser). */
function present(env: Environment): Environment {
  return { ...env, harness_topology: env.harness_topology ?? 'split', harness: env.harness ?? null, browser: env.browser ?? false };
}
function presentPage<P extends { data: Environment[] }>(page: P): P {
  return { ...page, data: page.data.map(present) };
}

/**
 * Browser observation is verified under the `container` tier only (docs/SANDBOX.md), and its
 * `browser_*` tools belong to the built-in loop: an ACP agent harness brings its own tools.
 */
function browserTier(browser: boolean | undefined, tier: string | undefined, harness?: { kind: string } | null): void {
  if (browser && (tier ?? 'container') !== 'container') {
    throw new ApiError('validation.malformed', "body.browser: browser observation runs under tier 'container' (Chromium under gVisor is not verified)");
  }
  if (browser && harness?.kind === 'acp') {
    throw new ApiError('validation.malformed', 'body.browser: the browser tools belong to the built-in harness; an ACP agent harness cannot have them');
  }
}

const EnvPath = Obj({ environment_id: Id('environment') });
const EnvVersionPath = Obj({ environment_id: Id('environment'), version: Type.Integer({ minimum: 1 }) });
const readers = { kind: 'bearer', roles: READERS } as const;
const writers = { kind: 'bearer', roles: WRITERS } as const;

export const environmentOperations: Operation[] = [
  workspaceWrite('POST', {
    operationId: 'environments.createEnvironment', path: '/v1/environments',
    audit: { target: 'response' },
    summary: 'Create an execution Environment (version 1)', auth: writers, body: CreateBody, response: EnvironmentSchema,
    successStatus: 201, idempotency: 'optional', mcp: 'full',
  }, async (ws, { body, keyed, deps }) => {
    const now = nowIso();
    browserTier(body.browser, body.tier, body.harness);
    const env: Environment = {
      id: newId('environment'), type: 'environment', workspace_id: ws, name: body.name, description: body.description ?? null,
      image: body.image, driver: 'docker', tier: body.tier ?? 'container', resources: withResources(DEFAULT_RESOURCES, body.resources),
      network: body.network ?? { mode: 'none' }, retention_mode: body.retention_mode ?? 'durable',
      harness_topology: body.harness_topology ?? 'split', harness: body.harness ?? null, packages: body.packages ?? {},
      browser: body.browser ?? false, metadata: body.metadata ?? {}, version: 1, archived_at: null, created_at: now, updated_at: now,
    };
    return createVersioned(deps.environments, ws, env, 'environment', keyed, 'environment-created');
  }),
  workspaceRead({
    operationId: 'environments.listEnvironments', path: '/v1/environments', summary: 'List Environments (latest versions)',
    auth: readers, query: PageQuery({ include_archived: Type.Optional(Type.Boolean({ default: false })) }), response: Page(EnvironmentSchema), mcp: 'full',
  }, async (ws, { query, deps }) => presentPage(await deps.environments.list(ws, { limit: query.limit ?? 20, page: query.page, includeArchived: query.include_archived ?? false }))),
  workspaceRead({
    operationId: 'environments.getEnvironment', path: '/v1/environments/{environment_id}',
    summary: 'Read the latest version of an Environment', auth: readers, params: EnvPath, response: EnvironmentSchema, mcp: 'full',
  }, async (ws, { params, deps }) => present(await deps.environments.get(ws, params.environment_id))),
  defineOperation({
    operationId: 'environments.updateEnvironment', method: 'POST', path: '/v1/environments/{environment_id}',
    audit: { target: 'environment_id' },
    summary: 'Publish a new version of an Environment; Sessions already created keep theirs', auth: writers, params: EnvPath,
    body: UpdateBody, response: EnvironmentSchema, idempotency: 'optional', mcp: 'full',
    async handler({ caller, params, body, deps, keyed }) {
      const { expected_version, ...patch } = body;
      return json(200, await deps.environments.newVersion(requireWorkspace(caller), params.environment_id, expected_version, (cur) => {
        const next: Environment = { ...present(cur) };
        for (const [k, v] of Object.entries(patch)) if (v !== undefined) (next as unknown as Record<string, unknown>)[k] = v;
        next.resources = withResources(cur.resources, patch.resources);
        browserTier(next.browser, next.tier, next.harness);
        next.description = patch.description !== undefined ? patch.description : cur.description;
        return next;
      }, keyed?.write('environment')));
    },
  }),
  workspaceWrite('POST', {
    operationId: 'environments.archiveEnvironment', path: '/v1/environments/{environment_id}/archive',
    audit: { target: 'environment_id' },
    summary: 'Archive an Environment: no new Sessions or versions', auth: writers, params: EnvPath, response: EnvironmentSchema,
    idempotency: 'optional', mcp: 'full',
  }, async (ws, { params, deps }) => present(await deps.environments.archive(ws, params.environment_id))),
  workspaceRead({
    operationId: 'environments.listEnvironmentVersions', path: '/v1/environments/{environment_id}/versions',
    summary: 'List the versions of an Environment, oldest first', auth: readers, params: EnvPath, query: PageQuery({}),
    response: Page(EnvironmentSchema), mcp: 'full',
  }, async (ws, { params, query, deps }) => presentPage(await deps.environments.listVersions(ws, params.environment_id, pageOf(query)))),
  workspaceRead({
    operationId: 'environments.getEnvironmentVersion', path: '/v1/environments/{environment_id}/versions/{version}',
    summary: 'Read one immutable Environment version', auth: readers, params: EnvVersionPath, response: EnvironmentSchema, mcp: 'full',
  }, async (ws, { params, deps }) => present(await deps.environments.getVersion(ws, params.environment_id, params.version))),
];
