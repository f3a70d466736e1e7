import { Id, LogicalKey, Nullable, Obj, Page, PageQuery, Timestamp, Type } from '@agentplane/core';
import { tags } from '@agentplane/store';
import { ADMINS, READERS } from '../http/caller.js';
import { createOnce, priorAttempt } from '../http/keyed-create.js';
import { defineOperation, json, type Operation } from '../http/operation.js';
import { listWorkspaceDocs, workspaceRead, workspaceWrite } from '../http/workspace-operation.js';
import { enforceRateLimit } from '../http/rate-limit.js';
import { requireWorkspace } from '../http/workspace-scope.js';
import type { ApiDeps } from '../deps.js';
import type { RunnerCredential, RunnerPool } from '@agentplane/domain';

/** A machine label: 1–200 characters, none of them a control character (C0, DEL or C1). */
const Label = () => Type.String({ minLength: 1, maxLength: 200, pattern: '^[^\\x00-\\x1f\\x7f-\\x9f]+$' });
const DrainBody = Obj({
  deadline_seconds: Type.Optional(Type.Integer({ minimum: 0, maximum: 7 * 24 * 3600, default: 3600 })),
  reason: Type.Optional(Type.String({ minLength: 1, maxLength: 512 })),
});
const DrainSchema = Nullable(Obj({ requested_at: Timestamp(), deadline: Timestamp(), reason: Type.String() }));

export const RunnerPoolSchema = Obj({
  id: Id('runnerPool'), type: Type.Literal('runner_pool'), workspace_id: Id('workspace'), name: Type.String(),
  placement: Type.Union([Type.Literal('byoc'), Type.Literal('managed')]), is_default: Type.Boolean(),
  status: Type.Union([Type.Literal('active'), Type.Literal('draining')]), drain: DrainSchema,
  version: Type.Integer(), created_at: Timestamp(), updated_at: Timestamp(),
});

export const RunnerCredentialSchema = Obj({
  id: Id('runnerCredential'), type: Type.Literal('runner_credential'), workspace_id: Id('workspace'), runner_pool_id: Id('runnerPool'),
  runner_id: Id('runner'), placement: Type.Union([Type.Literal('byoc'), Type.Literal('managed')]),
  owner: Nullable(Obj({ principal: Id('principal'), machine_label: Type.String() })), display_name: Type.String(),
  issued_via: Type.Union([Type.Literal('pairing'), Type.Literal('enrollment'), Type.Literal('local')]),
  pairing_id: Nullable(Id('runnerPairing')), status: Type.Union([Type.Literal('active'), Type.Literal('revoked')]),
  secret_hint: Type.String(), revoked_at: Nullable(Timestamp()), drain: DrainSchema,
  version: Type.Integer(), created_at: Timestamp(), updated_at: Timestamp(),
});

/**
 * The rate-limit bucket of a redeeming client: its IPv4 address, or the /64 network of an IPv6
 * one (a single host often holds a whole /64).
 */
function redeemSource(address: string | null): string {
  if (!address) return 'unknown';
  const v4 = /^(?:::ffff:)?(\d{1,3}(?:\.\d{1,3}){3})$/i.exec(address);
  if (v4?.[1]) return v4[1];
  const [head = '', tail = ''] = address.toLowerCase().split('%')[0]!.split('::');
  const left = head ? head.split(':') : [];
  const right = tail ? tail.split(':') : [];
  const groups = address.includes('::') ? [...left, ...Array<string>(Math.max(0, 8 - left.length - right.length)).fill('0'), ...right] : left;
  return `${groups.slice(0, 4).map((g) => g.replace(/^0+(?=.)/, '')).join(':')}::/64`;
}

const IssuedSchema = Obj({
  runner_credential: RunnerCredentialSchema,
  secret: Type.String({ description: 'ap_runner_… bearer, returned once' }),
  connect_path: Type.String(),
});

export const PresenceSchema = Type.Object({
  runner: Id('runner'), runner_pool: Id('runnerPool'), generation: Type.Integer(), placement: Type.String(),
  status: Type.Union([Type.Literal('starting'), Type.Literal('ready'), Type.Literal('draining')]),
  capabilities: Type.Object({}, { additionalProperties: true }), placement_conformance_digests: Type.Array(Type.String()),
  last_seen_at: Timestamp(), expires_at: Timestamp(),
  owner: Type.Optional(Obj({ principal: Id('principal'), machine_label: Type.String() })),
});

const PoolPath = Obj({ runner_pool_id: Id('runnerPool') });
const CredPath = Obj({ runner_credential_id: Id('runnerCredential') });
const RunnerPath = Obj({ runner_id: Id('runner') });
const connectPath = '/v1/runners/connect';

/** A keyed retry of pairing creation replays the code only while that pairing is still pending and unexpired. */
async function pairingReplayable(stored: unknown, deps: ApiDeps): Promise<boolean> {
  const s = stored as { code?: string; expires_at?: string };
  if (!s.code || !s.expires_at || Date.parse(s.expires_at) <= Date.now()) return false;
  return deps.runners.codePending(s.code);
}

async function issuedReplayable(stored: unknown, deps: ApiDeps): Promise<boolean> {
  const s = (stored as { runner_credential: RunnerCredential }).runner_credential;
  const live = await deps.docs.get<RunnerCredential>(tags.workspace(s.workspace_id), s.id);
  return !!live && live.status === 'active';
}

export const runnerOperations: Operation[] = [
  // ---- Presence (listed before /{runner_pool_id} so the literal segment wins) ----
  defineOperation({
    operationId: 'runnerPools.listPresences', method: 'GET', path: '/v1/runner-pools/presences',
    summary: 'List live runner presences (short-TTL readiness projection; never lease authority)',
    auth: { kind: 'bearer', roles: READERS }, query: PageQuery({ owner: Type.Optional(Id('principal')) }, 1000),
    response: Page(PresenceSchema), mcp: 'full',
    async handler({ caller, query, deps }) {
      const ws = requireWorkspace(caller);
      const owner = query.owner;
      return json(200, await deps.gatewayPresence.list(ws, {
        limit: query.limit ?? 20,
        page: query.page,
        ...(owner ? { filter: (p) => p.owner?.principal === owner } : {}),
      }));
    },
  }),

  // ---- Pools ----
  workspaceWrite('POST', {
    operationId: 'runnerPools.createRunnerPool', path: '/v1/runner-pools',
    audit: { target: 'response' },
    summary: 'Create a runner pool in the Workspace', auth: { kind: 'bearer', roles: ADMINS },
    body: Obj({ name: LogicalKey(), placement: Type.Union([Type.Literal('byoc'), Type.Literal('managed')]) }),
    response: RunnerPoolSchema, successStatus: 201, idempotency: 'optional', mcp: 'full',
  }, (ws, { body, deps, keyed }) => createOnce('runnerPool', keyed, (id) => deps.runners.findPool(ws, id), (id) => deps.runners.createPool(ws, body, id))),
  workspaceRead({
    operationId: 'runnerPools.listRunnerPools', path: '/v1/runner-pools',
    summary: 'List the runner pools of the Workspace (the default pool included)', auth: { kind: 'bearer', roles: READERS },
    query: PageQuery({}), response: Page(RunnerPoolSchema), mcp: 'full',
  }, async (ws, { query, deps }) => {
    await deps.runners.defaultPool(ws);
    return listWorkspaceDocs<RunnerPool>(deps, ws, 'runner_pools', query);
  }),
  workspaceRead({
    operationId: 'runnerPools.getRunnerPool', path: '/v1/runner-pools/{runner_pool_id}',
    summary: 'Read a runner pool', auth: { kind: 'bearer', roles: READERS }, params: PoolPath, response: RunnerPoolSchema, mcp: 'full',
  }, (ws, { params, deps }) => deps.runners.getPool(ws, params.runner_pool_id)),
  workspaceWrite('POST', {
    operationId: 'runnerPools.drainRunnerPool', path: '/v1/runner-pools/{runner_pool_id}/drain',
    audit: { target: 'runner_pool_id' },
    summary: 'Drain a pool: its runners take no new leases and finish held work until the deadline',
    auth: { kind: 'bearer', roles: ADMINS }, params: PoolPath, body: DrainBody, response: RunnerPoolSchema, idempotency: 'optional', mcp: 'full',
  }, (ws, { params, body, deps }) => deps.runners.drainPool(ws, params.runner_pool_id, body.deadline_seconds ?? 3600, body.reason ?? 'drain requested')),
  workspaceWrite('POST', {
    operationId: 'runnerPools.resumeRunnerPool', path: '/v1/runner-pools/{runner_pool_id}/resume',
    audit: { target: 'runner_pool_id' },
    summary: 'End a pool drain: connected runners take work again, runners that reconnect are ready', auth: { kind: 'bearer', roles: ADMINS }, params: PoolPath,
    response: RunnerPoolSchema, idempotency: 'optional', mcp: 'full',
  }, (ws, { params, deps }) => deps.runners.undrainPool(ws, params.runner_pool_id)),
  defineOperation({
    operationId: 'runnerPools.enrollRunner', method: 'POST', path: '/v1/runner-pools/{runner_pool_id}/enrollments',
    audit: { target: 'response', resource: 'runner_credential' },
    summary: 'Enroll a managed-pool runner with a runner-role API key; the credential is returned once (no owner)',
    auth: { kind: 'bearer', roles: ['root', 'admin', 'runner'] }, params: PoolPath, body: Obj({ machine_label: Label() }),
    response: IssuedSchema, successStatus: 201, idempotency: 'required', sensitive: true, mcp: 'never', replayable: issuedReplayable,
    async handler({ caller, params, body, deps, keyed }) {
      // Made once per request under its (required) key, as an API key is: the retry of an
      // enrollment that died after writing the runner's credential (crash point `runner-enrolled`,
      // before its secret is live) answers that runner with a new first secret, the first
      // attempt's never having been shown.
      const ws = requireWorkspace(caller);
      const { id, earlier } = await priorAttempt('runnerCredential', keyed, (id) => deps.runners.findCredential(ws, id));
      const issued = earlier
        ? await deps.runners.reissueFirstRunnerSecret(caller.organizationId, earlier)
        : await deps.runners.enroll(caller.organizationId, ws, params.runner_pool_id, body.machine_label, id, 'runner-enrolled');
      return json(201, { ...issued, connect_path: connectPath });
    },
  }),

  // ---- Pairing ----
  defineOperation({
    operationId: 'runnerPairings.createRunnerPairing', method: 'POST', path: '/v1/runner-pairings',
    audit: { target: 'response' },
    summary: 'Start pairing a machine for a Principal; the single-use code is returned once',
    auth: { kind: 'bearer', roles: ['root', 'admin', 'developer'] },
    body: Obj({
      principal_id: Id('principal'),
      machine_label: Label(),
      expires_in_seconds: Type.Optional(Type.Integer({ minimum: 120, maximum: 600, default: 600 })),
    }),
    response: Obj({ id: Id('runnerPairing'), code: Type.String(), expires_at: Timestamp() }),
    successStatus: 201, idempotency: 'required', sensitive: true, mcp: 'never',
    replayable: pairingReplayable,
    async handler({ caller, body, deps, keyed }) {
      const ws = requireWorkspace(caller);
      // Made once per request under its (required) key: the retry of a create that died after
      // writing the pairing (crash point `runner-pairing-created`, before its code is live)
      // answers that pairing with a new code, the first attempt's never having been shown; only
      // while it is still pending and unexpired, as a stored answer's code is replayed only then
      // (`pairingReplayable`), else 409 `idempotency.conflict`.
      const { id, earlier } = await priorAttempt('runnerPairing', keyed, (id) => deps.runners.getPairing(ws, id));
      const { pairing, code } = earlier ? await deps.runners.reissueFirstPairingCode(earlier) : await deps.runners.createPairing(caller.organizationId, ws, {
        principal_id: body.principal_id, machine_label: body.machine_label, expires_in_seconds: body.expires_in_seconds ?? 600,
      }, id, 'runner-pairing-created');
      return json(201, { id: pairing.id, code, expires_at: pairing.expires_at });
    },
  }),
  defineOperation({
    operationId: 'runnerPairings.redeemRunnerPairing', method: 'POST', path: '/v1/runner-pairings/redeem',
    audit: { target: 'response', resource: 'runner_credential' },
    summary: 'Redeem a pairing code (credential-free): mints a Workspace-scoped runner credential with the pairing owner',
    auth: { kind: 'none' },
    body: Obj({
      code: Type.String({ minLength: 1, maxLength: 64 }),
      runner_enrollment: Type.Optional(Obj({
        placement: Type.String({ minLength: 1, maxLength: 32 }),
        runner_pool_id: Type.Optional(Id('runnerPool')),
        display_name: Type.Optional(Label()),
        owner: Type.Optional(Type.Unknown()),
      })),
    }),
    response: IssuedSchema, successStatus: 201, mcp: 'never',
    async handler({ body, deps, clientAddress }) {
      // One source is limited first (PAIRING_REDEEM_PER_MINUTE), and the platform as a whole at
      // ten times that: a single client guessing codes cannot use up the platform-wide bucket
      // that every tenant's pairing shares, and one host pairing a pool is not held back.
      const perSource = deps.config.pairingRedeemPerMinute;
      await enforceRateLimit(deps.redis, `runner-pairing-redeem:${redeemSource(clientAddress)}`, perSource, Date.now(), 'pairing redemptions from this client address');
      await enforceRateLimit(deps.redis, 'runner-pairing-redeem', perSource * 10, Date.now(), 'pairing redemptions on this platform');
      const issued = await deps.runners.redeem(body);
      return json(201, { ...issued, connect_path: connectPath });
    },
  }),

  // ---- Runner credentials and runners ----
  workspaceRead({
    operationId: 'runnerCredentials.listRunnerCredentials', path: '/v1/runner-credentials',
    summary: 'List runner credentials (never secrets)', auth: { kind: 'bearer', roles: READERS },
    query: PageQuery({ runner_pool_id: Type.Optional(Id('runnerPool')) }), response: Page(RunnerCredentialSchema), mcp: 'full',
  }, async (ws, { query, deps }) => {
    const index = query.runner_pool_id ? `runner_credentials:${query.runner_pool_id}` : 'runner_credentials';
    return listWorkspaceDocs<RunnerCredential>(deps, ws, index, query);
  }),
  workspaceRead({
    operationId: 'runnerCredentials.getRunnerCredential', path: '/v1/runner-credentials/{runner_credential_id}',
    summary: 'Read a runner credential', auth: { kind: 'bearer', roles: READERS }, params: CredPath, response: RunnerCredentialSchema, mcp: 'full',
  }, (ws, { params, deps }) => deps.runners.getCredential(ws, params.runner_credential_id)),
  workspaceWrite('POST', {
    operationId: 'runnerCredentials.revokeRunnerCredential', path: '/v1/runner-credentials/{runner_credential_id}/revoke',
    audit: { target: 'runner_credential_id' },
    summary: 'Revoke a runner credential; its live socket closes within seconds', auth: { kind: 'bearer', roles: ADMINS },
    params: CredPath, response: RunnerCredentialSchema, idempotency: 'optional', mcp: 'full',
  }, (ws, { params, deps }) => deps.runners.revokeCredential(ws, params.runner_credential_id)),
  workspaceWrite('POST', {
    operationId: 'runners.resumeRunner', path: '/v1/runners/{runner_id}/resume',
    audit: { target: 'runner_id' },
    summary: 'Lift a runner drain: a runner that stayed connected takes work again (unless its pool drains)',
    auth: { kind: 'bearer', roles: ADMINS }, params: RunnerPath, response: RunnerCredentialSchema, idempotency: 'optional', mcp: 'full',
  }, (ws, { params, deps }) => deps.runners.resumeRunner(ws, params.runner_id)),
  workspaceWrite('POST', {
    operationId: 'runners.drainRunner', path: '/v1/runners/{runner_id}/drain',
    audit: { target: 'runner_id' },
    summary: 'Drain one runner: no new leases; held work finishes until the deadline, then is canceled',
    auth: { kind: 'bearer', roles: ADMINS }, params: RunnerPath, body: DrainBody, response: RunnerCredentialSchema, idempotency: 'optional', mcp: 'full',
  }, (ws, { params, body, deps }) => deps.runners.drainRunner(ws, params.runner_id, body.deadline_seconds ?? 3600, body.reason ?? 'drain requested')),
];

