import { ApiError, isId, newId, nowIso, staleOrAhead } from '@agentplane/core';
import { keys, tags, type DocumentStore, type Redis, type StoredDoc } from '@agentplane/store';

/** What a PermissionAssignment can grant (docs/GOVERNANCE.md, "Which boundary checks which action"). */
export const PERMISSION_ACTIONS = ['invoke', 'steer', 'observe', 'read', 'manage', 'approve'] as const;
export type PermissionAction = (typeof PERMISSION_ACTIONS)[number];

export type TargetType = 'workspace' | 'agent' | 'session' | 'memory_store' | 'surface_scope';

export interface PermissionTarget {
  type: TargetType;
  id: string;
}

export interface PermissionAssignment extends StoredDoc {
  type: 'permission_assignment';
  workspace_id: string;
  principal_id: string;
  target: PermissionTarget;
  actions: PermissionAction[];
}

export const ASSIGNMENTS = 'permission_assignments';
export const byPrincipal = (principalId: string): string => `permission_assignments:principal:${principalId}`;

/** The target an operation's request names, resolved for the check. */
export interface CheckTarget {
  type: TargetType;
  id: string;
  /** For a Session: its Agent (an assignment on the Agent covers the Agent's Sessions). */
  agentId?: string | undefined;
  /**
   * For a SurfaceScope: the ancestors it inherits from, nearest first (docs/SURFACE_SCOPES.md):
   * an assignment on any of them covers the scope.
   */
  inheritsFrom?: readonly string[] | undefined;
}

/**
 * PermissionAssignments of one Workspace (documents under the Workspace tag, indexed per
 * Principal so a live check is one ZRANGE and one MGET, no cache).
 */
export class PermissionStore {
  constructor(private readonly redis: Redis, private readonly docs: DocumentStore) {}

  async create(workspaceId: string, input: { principal_id: string; target: PermissionTarget; actions: PermissionAction[] }, id = newId('permissionAssignment')): Promise<PermissionAssignment> {
    const now = nowIso();
    const doc: PermissionAssignment = {
      id, type: 'permission_assignment', workspace_id: workspaceId,
      principal_id: input.principal_id, target: input.target, actions: normalise(input.actions),
      version: 1, created_at: now, updated_at: now,
    };
    await this.docs.create(tags.workspace(workspaceId), doc, [ASSIGNMENTS, byPrincipal(input.principal_id)]);
    return doc;
  }

  find(workspaceId: string, id: string): Promise<PermissionAssignment | null> {
    return this.docs.get<PermissionAssignment>(tags.workspace(workspaceId), id);
  }

  async get(workspaceId: string, id: string): Promise<PermissionAssignment> {
    const doc = await this.find(workspaceId, id);
    if (!doc || doc.type !== 'permission_assignment' || doc.workspace_id !== workspaceId) {
      throw new ApiError('validation.not_found', 'permission assignment not found');
    }
    return doc;
  }

  async update(workspaceId: string, id: string, actions: PermissionAction[], expectedVersion: number | undefined): Promise<PermissionAssignment> {
    await this.get(workspaceId, id);
    return this.docs.update<PermissionAssignment>(tags.workspace(workspaceId), id, (a) => ({
      ...a, actions: normalise(actions), version: a.version + 1, updated_at: nowIso(),
    }), { expectedVersion, notFound: 'permission assignment' });
  }

  /**
   * Revokes the assignment, with `expectedVersion` as one compare-and-delete: an update that
   * lands after the caller's read makes the delete 409 instead of being erased unseen. (Its
   * Principal, which names one of its indexes, never changes.)
   */
  async remove(workspaceId: string, id: string, expectedVersion: number | undefined): Promise<void> {
    const a = await this.get(workspaceId, id);
    const r = await this.docs.removeIfVersion(tags.workspace(workspaceId), id, expectedVersion, [ASSIGNMENTS, byPrincipal(a.principal_id)]);
    if (r.kind === 'missing') throw new ApiError('validation.not_found', 'permission assignment not found');
    if (r.kind === 'stale') {
      const at = (JSON.parse(r.current) as PermissionAssignment).version;
      throw new ApiError('validation.conflict', `expected_version ${expectedVersion ?? ''} ${staleOrAhead(expectedVersion, at)}; the assignment is at version ${at}`);
    }
  }

  /** Every live assignment of a Principal (read fresh on each call: a revoke counts from the next request). */
  async ofPrincipal(workspaceId: string, principalId: string): Promise<PermissionAssignment[]> {
    const tag = tags.workspace(workspaceId);
    const ids = await this.redis.zrange(keys.index(tag, byPrincipal(principalId)), 0, -1);
    return this.docs.getMany<PermissionAssignment>(tag, ids);
  }

  /**
   * Does the Principal hold `action` on `target`? An assignment on the exact target, on the
   * Workspace, or (for a Session) on the Session's Agent grants it.
   */
  async holds(workspaceId: string, principalId: string, action: PermissionAction, target: CheckTarget): Promise<boolean> {
    const held = await this.ofPrincipal(workspaceId, principalId);
    return held.some((a) => a.actions.includes(action) && covers(a.target, target, workspaceId));
  }

  /** Throws 403 `policy.denied` naming the missing assignment. */
  async require(workspaceId: string, principalId: string, action: PermissionAction, target: CheckTarget): Promise<void> {
    if (await this.holds(workspaceId, principalId, action, target)) return;
    const where = target.type === 'workspace' ? 'the Workspace' : `${target.type} ${target.id}${target.agentId ? ` (nor on its agent ${target.agentId})` : ''}`;
    throw new ApiError('policy.denied', `Principal ${principalId} holds no PermissionAssignment granting '${action}' on ${where}${target.type === 'workspace' ? '' : ' or on the Workspace'}`);
  }
}

export function covers(granted: PermissionTarget, wanted: CheckTarget, workspaceId: string): boolean {
  if (granted.type === 'workspace') return granted.id === workspaceId;
  if (granted.type === wanted.type && granted.id === wanted.id) return true;
  if (granted.type === 'surface_scope' && wanted.type === 'surface_scope') return wanted.inheritsFrom?.includes(granted.id) ?? false;
  return granted.type === 'agent' && wanted.type === 'session' && wanted.agentId === granted.id;
}

function normalise(actions: PermissionAction[]): PermissionAction[] {
  return PERMISSION_ACTIONS.filter((a) => actions.includes(a));
}

export function targetTypeOf(id: string): TargetType | null {
  if (isId('workspace', id)) return 'workspace';
  if (isId('agent', id)) return 'agent';
  if (isId('session', id)) return 'session';
  if (isId('memoryStore', id)) return 'memory_store';
  if (isId('surfaceScope', id)) return 'surface_scope';
  return null;
}
