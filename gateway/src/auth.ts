import { ERROR_STATUS, secretDigest } from '@agentplane/core';
import { getEach, keys, tags, type Redis } from '@agentplane/store';

/**
 * Who is on the other end of a runner socket, resolved on upgrade from the bearer. Reads the
 * same records the API writes (bearer digest → auth record, credential and tenancy documents),
 * so a standalone gateway needs nothing but Redis.
 */
export interface RunnerIdentity {
  credentialId: string;
  organizationId: string;
  workspaceId: string;
  runnerId: string;
  runnerPoolId: string;
  placement: 'byoc' | 'managed';
  owner: { principal: string; machine_label: string } | null;
  /** Drain requested for this runner before it connected. */
  drain: { deadline: string; reason: string } | null;
}

/** Why an upgrade is refused: catalog error types only (the status follows from the type). */
export type AuthFailureType = 'auth.invalid_key' | 'auth.disabled_tenancy' | 'policy.denied';

export class AuthFailure extends Error {
  readonly status: 401 | 403;
  constructor(
    readonly type: AuthFailureType,
    message: string,
  ) {
    super(message);
    this.name = 'AuthFailure';
    this.status = ERROR_STATUS[type];
  }
}

interface AuthRecordView {
  kind: string;
  credential_id: string;
  organization_id: string;
  workspace_id: string | null;
  principal_id: string | null;
}
interface CredView {
  status: string;
  workspace_id: string;
  runner_id: string;
  runner_pool_id: string;
  placement: 'byoc' | 'managed';
  owner: { principal: string; machine_label: string } | null;
  drain: { deadline: string; reason: string } | null;
}
interface StatusView {
  status: string;
}

export function bearerFrom(header: string | undefined): string | null {
  if (!header) return null;
  const m = /^Bearer ([\x21-\x7e]{8,512})$/i.exec(header.trim());
  return m?.[1] ?? null;
}

export async function authenticateRunner(redis: Redis, token: string | null): Promise<RunnerIdentity> {
  if (!token) throw new AuthFailure('auth.invalid_key', 'missing bearer credential');
  const digest = secretDigest(token);
  const raw = await redis.get(keys.auth(digest));
  if (!raw) throw new AuthFailure('auth.invalid_key', 'unknown or revoked credential');
  const rec = JSON.parse(raw) as AuthRecordView;
  if (rec.kind !== 'runner_credential' || !rec.workspace_id) throw new AuthFailure('policy.denied', 'only runner credentials may connect');
  const ws = rec.workspace_id;
  const [credRaw, wsRaw, orgRaw, principalRaw] = await getEach(redis, [
    keys.doc(tags.workspace(ws), rec.credential_id),
    keys.doc(tags.workspace(ws), ws),
    keys.doc(tags.org(rec.organization_id), rec.organization_id),
    rec.principal_id ? keys.doc(tags.workspace(ws), rec.principal_id) : keys.doc(tags.workspace(ws), 'none'),
  ]);
  if (!credRaw) throw new AuthFailure('auth.invalid_key', 'unknown or revoked credential');
  const cred = JSON.parse(credRaw) as CredView;
  if (cred.status !== 'active') throw new AuthFailure('auth.invalid_key', 'the runner credential is revoked');
  if (!wsRaw || !orgRaw) throw new AuthFailure('auth.invalid_key', 'unknown tenancy');
  if ((JSON.parse(wsRaw) as StatusView).status !== 'active' || (JSON.parse(orgRaw) as StatusView).status !== 'active') {
    throw new AuthFailure('auth.disabled_tenancy', 'the workspace or organization is disabled');
  }
  if (rec.principal_id) {
    if (!principalRaw || (JSON.parse(principalRaw) as StatusView).status !== 'active') {
      throw new AuthFailure('policy.denied', 'the owner Principal of this runner is not active');
    }
  }
  return {
    credentialId: rec.credential_id,
    organizationId: rec.organization_id,
    workspaceId: ws,
    runnerId: cred.runner_id,
    runnerPoolId: cred.runner_pool_id,
    placement: cred.placement,
    owner: cred.owner,
    drain: cred.drain,
  };
}

/**
 * What a live connection should have heard, read afresh (one MGET): whether it is still allowed
 * (the credential active, else 401; its owner Principal and Workspace active, else 403) and the
 * drain in force for it now (its own, else its pool's), or null.
 */
export async function currentStanding(redis: Redis, id: RunnerIdentity): Promise<{ verdict: 'ok' | 401 | 403; drain: { deadline: string; reason: string } | null }> {
  const ws = tags.workspace(id.workspaceId);
  const [credRaw, principalRaw, wsRaw, poolRaw] = await redis.mget(
    keys.doc(ws, id.credentialId),
    id.owner ? keys.doc(ws, id.owner.principal) : keys.doc(ws, 'none'),
    keys.doc(ws, id.workspaceId),
    poolDocKey(id.workspaceId, id.runnerPoolId),
  );
  const status = (raw: string | null | undefined) => (raw ? (JSON.parse(raw) as StatusView).status : null);
  if (status(credRaw) !== 'active') return { verdict: 401, drain: null };
  if ((id.owner && status(principalRaw) !== 'active') || status(wsRaw) !== 'active') return { verdict: 403, drain: null };
  const own = (JSON.parse(credRaw as string) as CredView).drain;
  return { verdict: 'ok', drain: own ? { deadline: own.deadline, reason: own.reason } : poolDrainOf(poolRaw ?? null) };
}

/** Is this identity still allowed (backstop for a missed revocation message, and for a disabled Workspace)? */
export async function stillAuthorized(redis: Redis, id: RunnerIdentity): Promise<'ok' | 401 | 403> {
  return (await currentStanding(redis, id)).verdict;
}

export const poolDocKey = (ws: string, poolId: string): string => keys.doc(tags.workspace(ws), poolId);

/** The pool's drain state, if it is draining (from the pool document's JSON). */
export function poolDrainOf(raw: string | null): { deadline: string; reason: string } | null {
  if (!raw) return null;
  const p = JSON.parse(raw) as { status: string; drain: { deadline: string; reason: string } | null };
  return p.status === 'draining' && p.drain ? { deadline: p.drain.deadline, reason: p.drain.reason } : null;
}
