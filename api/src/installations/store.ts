import { ApiError, newId, nowIso } from '@agentplane/core';
import { keys, tags, type DocumentStore, type Redis, type StoredDoc } from '@agentplane/store';

/** An Agent (one pinned version) installed on one or more SurfaceScopes. */
export interface AgentInstallation extends StoredDoc {
  type: 'agent_installation';
  workspace_id: string;
  agent: { id: string; version: number };
  environment_id: string;
  surface_scope_ids: string[];
  /** The service Principal the installed agent executes as (created with the installation). */
  principal_id: string;
  display_name: string | null;
  status: 'active' | 'archived';
  archived_at: string | null;
}

export const AGENT_INSTALLATIONS = 'agent_installations';
const byScope = (surf: string): string => `agent_installations:scope:${surf}`;
/** Service Principal → installation: the Principals installed agents execute as. */
const installedPrincipals = 'agent_installation_principals';

export class AgentInstallationStore {
  constructor(private readonly redis: Redis, private readonly docs: DocumentStore) {}

  async create(ws: string, input: { agent: { id: string; version: number }; environment_id: string; surface_scope_ids: string[]; principal_id: string; display_name: string | null }, id = newId('agentInstallation')): Promise<AgentInstallation> {
    const now = nowIso();
    const doc: AgentInstallation = {
      id, type: 'agent_installation', workspace_id: ws, agent: input.agent, environment_id: input.environment_id,
      surface_scope_ids: [...new Set(input.surface_scope_ids)], principal_id: input.principal_id, display_name: input.display_name,
      status: 'active', archived_at: null, version: 1, created_at: now, updated_at: now,
    };
    const tag = tags.workspace(ws);
    await this.redis.hset(keys.unique(tag, installedPrincipals), input.principal_id, doc.id);
    await this.docs.create(tag, doc, [AGENT_INSTALLATIONS, ...doc.surface_scope_ids.map(byScope)]);
    return doc;
  }

  /** The installation stored under `id` in the Workspace, whatever its status; null when there is none. */
  async find(ws: string, id: string): Promise<AgentInstallation | null> {
    const doc = await this.docs.get<AgentInstallation>(tags.workspace(ws), id);
    return doc && doc.type === 'agent_installation' && doc.workspace_id === ws ? doc : null;
  }

  async get(ws: string, id: string): Promise<AgentInstallation> {
    const doc = await this.docs.get<AgentInstallation>(tags.workspace(ws), id);
    if (!doc || doc.type !== 'agent_installation' || doc.workspace_id !== ws) throw new ApiError('validation.not_found', `agent installation ${id} not found`);
    return doc;
  }

  async update(ws: string, id: string, patch: { agent?: { id: string; version: number }; surface_scope_ids?: string[]; display_name?: string | null }, expectedVersion: number | undefined): Promise<AgentInstallation> {
    const cur = await this.get(ws, id);
    const tag = tags.workspace(ws);
    let replaced = cur;
    const next = await this.docs.update<AgentInstallation>(tag, id, (d) => {
      if (d.status !== 'active') throw new ApiError('runtime.invalid_transition', `agent installation ${id} is archived`);
      replaced = d;
      return {
        ...d,
        ...(patch.agent ? { agent: patch.agent } : {}),
        ...(patch.surface_scope_ids ? { surface_scope_ids: [...new Set(patch.surface_scope_ids)] } : {}),
        ...(patch.display_name !== undefined ? { display_name: patch.display_name } : {}),
        version: d.version + 1, updated_at: nowIso(),
      };
    }, { expectedVersion, notFound: 'agent installation', current: cur });
    if (patch.surface_scope_ids) {
      // The per-scope listings follow the version this update replaced. Two updates racing may
      // still leave an entry for a scope the installation left: `list` reads the document's own
      // scopes, never the listing alone.
      const score = Date.parse(next.created_at);
      const multi = this.redis.multi();
      for (const s of replaced.surface_scope_ids) if (!next.surface_scope_ids.includes(s)) multi.zrem(keys.index(tag, byScope(s)), id);
      for (const s of next.surface_scope_ids) multi.zadd(keys.index(tag, byScope(s)), score, id);
      await multi.exec();
    }
    return next;
  }

  async archive(ws: string, id: string, expectedVersion: number | undefined): Promise<AgentInstallation> {
    const cur = await this.get(ws, id);
    if (cur.status === 'archived') return cur;
    return this.docs.update<AgentInstallation>(tags.workspace(ws), id, (d) => d.status === 'archived' ? null : {
      ...d, status: 'archived', archived_at: nowIso(), version: d.version + 1, updated_at: nowIso(),
    }, { expectedVersion, notFound: 'agent installation', current: cur }).then(async (d) => d ?? this.get(ws, id));
  }

  async list(ws: string, q: { limit: number; page?: string | undefined; surface_scope_id?: string | undefined; status?: 'active' | 'archived' | undefined }) {
    const { status, surface_scope_id: scope } = q;
    const filter = status || scope
      ? (d: AgentInstallation) => (!status || d.status === status) && (!scope || d.surface_scope_ids.includes(scope))
      : undefined;
    return this.docs.list<AgentInstallation>(tags.workspace(ws), scope ? byScope(scope) : AGENT_INSTALLATIONS,
      { limit: q.limit, page: q.page, order: 'asc' }, filter);
  }

  /** Is this Principal the one some installed agent of the Workspace executes as? */
  async installationOfPrincipal(ws: string, principalId: string): Promise<string | null> {
    return this.redis.hget(keys.unique(tags.workspace(ws), installedPrincipals), principalId);
  }
}
