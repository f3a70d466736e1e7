import { ApiError, isId, secretDigest } from '@agentplane/core';
import { tags } from '@agentplane/store';
import type { ApiDeps } from '../deps.js';
import type { AuthRecord, Organization, Principal, Workspace } from '@agentplane/domain';
import type { Caller } from './caller.js';
import type { AuthPolicy } from './operation.js';

/** Request header an organization-scoped key uses to pick a workspace. */
export const WORKSPACE_SELECTOR_HEADER = 'service-workspace-id';

const invalidKey = () => new ApiError('auth.invalid_key', 'missing, unknown or revoked credential');

export function bearerToken(authorization: string | undefined): string | null {
  if (!authorization) return null;
  const m = /^Bearer ([\x21-\x7e]{8,512})$/i.exec(authorization.trim());
  return m?.[1] ?? null;
}

/**
 * Resolve a bearer to a Caller: credential digest → auth record, then the live tenancy
 * (Organization and Workspace not disabled) and, for Principal-bound bearers, the Principal.
 * Each is read through the process's read cache, which Redis invalidates on every change, so a
 * revoked key, a disabled tenancy or a suspended Principal is refused on the next request.
 * When the cache holds all of them the Caller is returned at once (no promise: this is every
 * authenticated request's path); otherwise they are read and a promise is returned.
 */
export function authenticate(headers: Readonly<Record<string, string | undefined>>, deps: ApiDeps, connection?: object): Caller | Promise<Caller> {
  const digest = bearerDigest(headers.authorization, connection);
  if (!digest) throw invalidKey();
  const selector = headers[WORKSPACE_SELECTOR_HEADER];
  const record = deps.credentials.peek(digest);
  if (record === null) throw invalidKey();
  if (record !== undefined) {
    const workspaceId = workspaceOf(record, selector);
    const org = deps.docs.peekShared<Organization>(tags.org(record.organization_id), record.organization_id);
    // An organization key without a selector acts in the organization's default Workspace, whose
    // status is checked like a selected one's (from the read cache as well).
    const wsId = workspaceId ?? (org ? org.default_workspace_id : null);
    const ws = wsId ? deps.docs.peekShared<Workspace>(tags.workspace(wsId), wsId) : null;
    const principal = principalRef(record) ? deps.docs.peekShared<Principal>(tags.workspace(record.workspace_id ?? ''), record.principal_id ?? '') : null;
    if (org !== undefined && ws !== undefined && principal !== undefined) return callerOf(record, workspaceId, org, ws, principal);
  }
  return readCaller(digest, selector, deps);
}

/**
 * The last bearer each connection presented, with its digest: a client sends the same
 * Authorization header on every request of a kept-alive connection, and digesting it was a few
 * percent of an authenticated GET's CPU. Kept only while the connection (the socket object)
 * lives; the credential itself is still looked up, through the read cache, on every request.
 */
const lastBearer = new WeakMap<object, { authorization: string; digest: string }>();

/** The `secretDigest` of the request's bearer; null when the header holds none. */
function bearerDigest(authorization: string | undefined, connection: object | undefined): string | null {
  if (!authorization) return null;
  const last = connection ? lastBearer.get(connection) : undefined;
  if (last && last.authorization === authorization) return last.digest;
  const token = bearerToken(authorization);
  if (!token) return null;
  const digest = secretDigest(token);
  if (connection) lastBearer.set(connection, { authorization, digest });
  return digest;
}

async function readCaller(digest: string, selector: string | undefined, deps: ApiDeps): Promise<Caller> {
  const record = await deps.credentials.resolve(digest);
  if (!record) throw invalidKey();
  const workspaceId = workspaceOf(record, selector);
  const [org, selected, principal] = await Promise.all([
    deps.docs.getCached<Organization>(tags.org(record.organization_id), record.organization_id),
    workspaceId ? deps.docs.getCached<Workspace>(tags.workspace(workspaceId), workspaceId) : Promise.resolve(null),
    principalRef(record) ? deps.docs.getCached<Principal>(tags.workspace(record.workspace_id ?? ''), record.principal_id ?? '') : Promise.resolve(null),
  ]);
  const ws = workspaceId || !org ? selected : await deps.docs.getCached<Workspace>(tags.workspace(org.default_workspace_id), org.default_workspace_id);
  return callerOf(record, workspaceId, org, ws, principal);
}

/** The Workspace a request acts in: the credential's own, else the selector header's (organization keys only). */
function workspaceOf(record: Readonly<AuthRecord>, selector: string | undefined): string | null {
  if (record.workspace_id !== null && selector !== undefined) {
    // The bearer is resolved: the refusal names the Workspace, as every authenticated answer does.
    throw new ApiError('validation.malformed', 'workspace selector headers are rejected for workspace-bound credentials', { headers: { 'Service-Workspace-Id': record.workspace_id } });
  }
  if (selector !== undefined && !isId('workspace', selector)) {
    throw new ApiError('validation.malformed', `${WORKSPACE_SELECTOR_HEADER} must be a Workspace id (wrkspc_…)`);
  }
  return record.workspace_id ?? selector ?? null;
}

/** Whether the credential is bound to a Principal of its Workspace (whose status is then read). */
const principalRef = (record: Readonly<AuthRecord>): boolean => Boolean(record.principal_id && record.workspace_id);

function callerOf(
  record: Readonly<AuthRecord>, workspaceId: string | null, org: Readonly<Organization> | null, ws: Readonly<Workspace> | null, principal: Readonly<Principal> | null,
): Caller {
  if (!org) throw invalidKey();
  if (org.status === 'disabled') throw new ApiError('auth.disabled_tenancy', 'the organization is disabled');

  let resolvedWorkspace: string | null = workspaceId;
  let defaultDisabled = false;
  let disabledSelected = false;
  if (workspaceId !== null) {
    if (!ws || ws.organization_id !== org.id) {
      if (record.workspace_id !== null) throw invalidKey();
      throw new ApiError('validation.not_found', 'workspace not found');
    }
    if (ws.status === 'disabled') disabledSelected = true;
  } else {
    resolvedWorkspace = org.default_workspace_id;
    if (ws && ws.id === resolvedWorkspace && ws.status === 'disabled') defaultDisabled = true;
  }

  if (record.principal_id && record.kind !== 'api_key') {
    // Principal-bound bearers die with their Principal: suspended or deleted denies the next request.
    if (!principal || principal.status !== 'active') throw invalidKey();
  }

  const caller: Caller = {
    kind: record.kind,
    credentialId: record.credential_id,
    organizationId: record.organization_id,
    workspaceId: resolvedWorkspace,
    scope: record.workspace_id === null ? 'organization' : 'workspace',
    role: record.role,
    principalId: record.principal_id,
    audience: record.audience,
    rateLimitPerMinute: record.rate_limit_per_minute,
  };
  if (defaultDisabled) inDisabledDefault.add(caller);
  // The credential is resolved: the refusal carries the caller, for the response's Workspace
  // header and the audit record, and an organization-level operation may still go on.
  if (disabledSelected) throw new DisabledWorkspaceError(caller);
  return caller;
}

/**
 * 403 `auth.disabled_tenancy` for a credential whose Workspace (its own, or the one an
 * organization key selects) is disabled, carrying the caller it resolved to: the pipeline names
 * that Workspace in the answer, records the attempt, and lets an organization key's
 * organization-level operations (and the re-enabling PATCH) through, as for a disabled default
 * Workspace. Every other edge refuses it as it is.
 */
export class DisabledWorkspaceError extends ApiError {
  constructor(readonly caller: Caller) {
    super('auth.disabled_tenancy', 'the workspace is disabled', caller.workspaceId ? { headers: { 'Service-Workspace-Id': caller.workspaceId } } : {});
  }
}

/** Callers whose Workspace is their organization's default one, found disabled (see `actsInDisabledDefault`). */
const inDisabledDefault = new WeakSet<Caller>();

/**
 * Whether this organization-key caller named no Workspace and its organization's default
 * Workspace, where it would act, is disabled. Such a caller may still call organization-level
 * operations (manage keys and Workspaces, re-enable the default one); anything that acts in a
 * Workspace is refused with 403 `auth.disabled_tenancy`, exactly as with the selector header.
 */
export function actsInDisabledDefault(caller: Caller): boolean {
  return inDisabledDefault.has(caller);
}

export const disabledWorkspace = () => new ApiError('auth.disabled_tenancy', 'the workspace is disabled');

/** Does the caller's kind and role satisfy the operation's policy? */
export function authorize(caller: Caller, policy: Extract<AuthPolicy, { kind: 'bearer' }>): void {
  switch (caller.kind) {
    case 'api_key':
      if (!caller.role || !policy.roles.includes(caller.role)) {
        throw new ApiError('policy.denied', `the '${caller.role ?? 'none'}' role may not call this operation`);
      }
      if (policy.organizationScope && caller.scope !== 'organization') {
        throw new ApiError('policy.denied', 'this operation needs an organization-scoped key');
      }
      return;
    case 'principal_credential':
      if (caller.audience !== 'api_mcp' || !policy.principal) {
        throw new ApiError('policy.denied', 'a principal credential may not call this operation');
      }
      return;
    case 'runner_credential':
      if (!policy.runner) throw new ApiError('policy.denied', 'a runner credential may not call this operation');
      return;
    default:
      throw invalidKey();
  }
}
