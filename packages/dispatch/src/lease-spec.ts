import {
  bindingShapings, buildTurnSpec, readAll, type ConnectionGrant, type ConnectionService, type Environment, type FileStore, type ProjectHeadReader,
  type RedisRuntimeBearers, type SandboxProfile, type SessionStore, type SkillReader, type ToolShaping, type VersionedStore,
} from '@agentplane/domain';
import { tags, type DocumentStore, type Redis, type StoredDoc } from '@agentplane/store';
import type { LeasePlan } from './directory.js';

/** Where a lease's turn spec is read from. */
export interface LeaseSpecSources {
  redis: Redis;
  store: SessionStore;
  /** Versions never change: a store that keeps the ones it read (`cacheVersions`) saves a read per Run. */
  environments: VersionedStore<Environment>;
  sandboxProfiles: VersionedStore<SandboxProfile>;
  docs: DocumentStore;
  files: FileStore;
  projects: ProjectHeadReader;
  skills: SkillReader;
  bearers: RedisRuntimeBearers;
  /** Absent without a master key: an agent's Connections cannot be resolved then. */
  connections: ConnectionService | undefined;
}

/**
 * The body every offer of one lease carries: the turn spec, with a runtime bearer when the turn
 * needs one (its Connections, Files, memory, repositories, projects, skills, browser outputs).
 */
export class LeaseSpecBuilder {
  constructor(private readonly d: LeaseSpecSources) {}

  async build(o: LeasePlan): Promise<Record<string, unknown>> {
    // The Run, its Session and the Session's event log in one round trip (the Session is read
    // once, for the spec and the vaults; the log needs only the Session's id, not the Run).
    const events = readAll(this.d.store.log, o.session_id);
    events.catch(() => undefined);
    const [run, session] = await Promise.all([this.d.store.run(o.session_id, o.run_id), this.d.store.get(o.workspace_id, o.session_id).catch(() => null)]);
    if (!run) throw new Error(`run ${o.run_id} not found`);
    const sources = { store: this.d.store, environments: this.d.environments, sandboxProfiles: this.d.sandboxProfiles, files: this.d.files, projects: this.d.projects, skills: this.d.skills };
    const spec = await buildTurnSpec(sources, run, undefined, { ...(session ? { session } : {}), events });
    const resolved = this.d.connections && run.agent.mcp_servers.some((s) => s.type !== 'a2a_tool_source')
      ? await this.d.connections.resolveAgentServers(run.workspace_id, run.agent.mcp_servers)
      : undefined;
    const files = spec.resources.flatMap((r) => (r.type === 'file' && !r.missing ? [r.file_id] : []));
    const memory = spec.memory ?? [];
    const projects = spec.resources.flatMap((r) => (r.type === 'uploaded_project' ? [`${r.project_id}@${r.revision_number}`] : []));
    const skills = (spec.skills ?? []).map((k) => k.ref);
    // Repositories fetched over HTTPS may need a vault credential: only when the Session names vaults.
    const repositories = (session?.vault_ids.length ?? 0) > 0
      ? spec.resources.flatMap((r) => (r.type === 'repository' && r.url.startsWith('https://') ? [r.url] : []))
      : [];
    // A browser Environment's screenshots are stored as Files of the Session through the bearer.
    const outputs = spec.environment.browser === true;
    // Synced A2A tool sources the agent attaches: served by the api's runtime tool source endpoint.
    const toolSources = run.agent.mcp_servers.flatMap((s) => (s.type === 'a2a_tool_source' ? [{ name: s.name, id: s.tool_source_id }] : []));
    if (!resolved && toolSources.length === 0 && files.length === 0 && memory.length === 0 && repositories.length === 0 && projects.length === 0 && skills.length === 0 && !outputs) return spec as unknown as Record<string, unknown>;
    // One runtime bearer for this lease: it works only while the lease holds the Session fence,
    // for the agent's Connections, the Session's Files and its MemoryStores.
    const ws = await this.d.docs.get<{ organization_id: string } & StoredDoc>(tags.workspace(run.workspace_id), run.workspace_id);
    // The built-in harness asks through user.tool_confirmation before it calls an always_ask
    // tool, so the grant itself allows the call.
    // A Session on a deployment: the binding revisions its deployment revision selected shape
    // the tools of the Connections they bind (docs/DEPLOYMENTS.md).
    const selections = run.agent_deployment?.connection_binding_selections ?? [];
    const shapings = resolved && selections.length > 0 ? await bindingShapings(this.d.redis, this.d.docs, run.workspace_id, selections) : new Map<string, ToolShaping>();
    const grants = Object.fromEntries(Object.keys(resolved?.grants ?? {}).map((id): [string, ConnectionGrant] => {
      const shaping = shapings.get(id);
      return [id, { default: 'allow', ...(shaping ? { shaping } : {}) }];
    }));
    const bearer = await this.d.bearers.mint({
      run_id: run.id, session_id: run.session_id, session_thread_id: run.session_thread_id, workspace_id: run.workspace_id, organization_id: ws?.organization_id ?? '',
      lease_id: o.lease_id, expires_at: new Date(Date.now() + spec.environment.resources.max_duration_seconds * 1000 + o.lease_ms).toISOString(),
      connections: grants, files, ...(repositories.length > 0 ? { repositories } : {}), ...(projects.length > 0 ? { projects } : {}), ...(skills.length > 0 ? { skills } : {}), ...(outputs ? { outputs: true } : {}), ...(toolSources.length > 0 ? { tool_sources: toolSources.map((t) => t.id) } : {}), ...(memory.length > 0 ? { memory: Object.fromEntries(memory.map((m) => [m.memory_store_id, m.access])) } : {}),
    });
    const servers: NonNullable<typeof spec.runtime_mcp>['servers'] = [];
    if (resolved) {
      const permission = new Map(run.agent.mcp_servers.map((s) => [s.name, s.permission ?? 'always_ask']));
      servers.push(...resolved.servers.map((s) => ({ ...s, permission: permission.get(s.name) ?? 'always_ask' })));
    }
    for (const t of toolSources) servers.push({ name: t.name, connection_id: t.id, permission: 'always_ask', path: `/v1/runtime/toolsource/${t.id}` });
    // Memory tools are the platform's own: allowed without a confirmation (ActionPolicies still decide each use).
    memory.forEach((m, i) => servers.push({
      name: i === 0 ? 'memory' : `memory_${i + 1}`, connection_id: m.memory_store_id, permission: 'always_allow', path: `/v1/runtime/memory/${m.memory_store_id}`,
    }));
    if (servers.length > 0) spec.runtime_mcp = { bearer, servers };
    if (files.length > 0 || repositories.length > 0 || projects.length > 0 || skills.length > 0 || outputs) spec.runtime_files = { bearer };
    return spec as unknown as Record<string, unknown>;
  }
}
