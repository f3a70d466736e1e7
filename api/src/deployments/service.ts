import { ApiError, canonicalJson, crashPoint, newId, nowIso, sha256Hex, staleOrAhead } from '@agentplane/core';
import {
  ConnectionService, exposedNameClash, harnessProfileStore, sandboxProfileStore, snapshotOf, type Agent, type DeploymentPin, type HarnessProfile, type SandboxProfile, type VersionedStore,
} from '@agentplane/domain';
import type { ApiDeps } from '../deps.js';
import { createVersioned } from '../http/keyed-create.js';
import type { KeyedRequest } from '../http/idempotency.js';
import type { KeyedWrite } from '@agentplane/store';
import { deploymentId, HeadStore, revisionId, type HeadDoc } from './store.js';
import type { ExecutionTargetT, PublishRevisionInput } from './schemas.js';

const DEPLOYMENTS = 'agent_deployments';
const DEPLOYMENT_KEYS = 'agent_deployment_keys';
const BINDINGS = (adep: string) => `agent_deployment_connection_bindings:${adep}`;
const BINDING_KEYS = (adep: string) => `agent_deployment_connection_binding_keys:${adep}`;
const HARNESSES = 'connected_harnesses';
const HARNESS_KEYS = 'connected_harness_keys';
export const HARNESS_PROFILE_KEYS = 'harness_profile_keys';
export const SANDBOX_PROFILE_KEYS = 'sandbox_profile_keys';

export interface DeploymentDoc extends HeadDoc {
  workspace_id: string;
  agent_id: string;
  key: string;
  display_name: string | null;
  archived_at: string | null;
  /** The Workspace holding the Agent (another Workspace of the Organization after a cross-workspace deploy). */
  _agent_workspace_id: string;
  /** A keyed create's request (derived from its key and body; never shown): tells its retry's deployment from another's. */
  _request?: string;
}

export interface RevisionDoc {
  id: string;
  agent_deployment_id: string;
  workspace_id: string;
  revision_number: number;
  agent_id: string;
  agent_release_number: number;
  model_routing_profile_id: string;
  model_routing_profile_revision_number: number;
  execution_target: ExecutionTargetT;
  skill_selections: { skill_id: string; skill_revision_number: number }[];
  connection_binding_selections: { agent_deployment_connection_binding_id: string; binding_revision_number: number }[];
  roster_snapshot: PublishRevisionInput['roster_snapshot'] | null;
  resolved_configuration_sha256: string;
  published_by: { kind: 'system' } | { kind: 'api_key'; api_key_id: string };
  published_at: string;
}

export interface BindingDoc extends HeadDoc {
  workspace_id: string;
  agent_deployment_id: string;
  integration_connection_id: string;
  key: string;
  display_name: string | null;
}

export interface BindingRevisionDoc {
  agent_deployment_connection_binding_id: string;
  workspace_id: string;
  binding_revision_number: number;
  tool_selection: string[];
  tool_aliases: Record<string, string>;
  argument_policy: 'default' | 'strict';
  published_at: string;
}

export interface ConnectedHarnessDoc extends HeadDoc {
  workspace_id: string;
  key: string;
  display_name: string | null;
  capability_set_digest: string;
}

/** Heads carry `version` as their compare-and-swap counter; the wire calls it `resource_version`. */
export function headView<T extends HeadDoc>(d: T): Record<string, unknown> {
  const out: Record<string, unknown> = {};
  for (const [k, v] of Object.entries(d)) if (!k.startsWith('_') && k !== 'version') out[k] = v;
  out.resource_version = d.version;
  if (d.id.startsWith('chrn_')) delete out.current_revision_number;
  return out;
}

export function profileView<T extends HarnessProfile | SandboxProfile>(p: T): Record<string, unknown> {
  const { version, ...rest } = p;
  return { ...rest, revision_number: version };
}

/** The digest of a resolved configuration: sha256 over its canonical JSON. */
export function configurationDigest(config: unknown): string {
  return `sha256:${sha256Hex(canonicalJson(config))}`;
}

/**
 * AgentDeployments (`adep_`): a Workspace-scoped deployment of one Agent with immutable
 * revisions, their connection bindings, and the deploy operation (docs/DEPLOYMENTS.md).
 */
export class DeploymentService {
  readonly heads: HeadStore;
  readonly harnessProfiles: VersionedStore<HarnessProfile>;
  readonly sandboxProfiles: VersionedStore<SandboxProfile>;

  constructor(private readonly d: ApiDeps) {
    this.heads = new HeadStore(d.redis, d.docs);
    this.harnessProfiles = harnessProfileStore(d.redis);
    this.sandboxProfiles = sandboxProfileStore(d.redis);
  }

  private deps(): ApiDeps {
    return this.d;
  }

  // ---- heads ---------------------------------------------------------------------------------

  /**
   * A deployment's id is fixed by its Workspace and Agent, so a second create of it is refused
   * (409 `validation.conflict`). `request`: a keyed create's (derived from its key and request,
   * the same for every attempt), kept on the head; the retry of one whose first attempt died after
   * writing finds the deployment that attempt made and gets it back, as `earlier`, to answer
   * (another request's deployment is still refused).
   */
  async create(ws: string, input: { agent_id: string; key: string; display_name?: string | null | undefined }, agentWs = ws, request?: string): Promise<{ doc: DeploymentDoc; earlier: boolean }> {
    const agent = await this.deps().agents.get(agentWs, input.agent_id);
    if (agent.archived_at !== null) throw new ApiError('runtime.invalid_transition', 'the agent is archived');
    const now = nowIso();
    const doc: DeploymentDoc = {
      id: deploymentId(ws, input.agent_id), workspace_id: ws, agent_id: input.agent_id, key: input.key, display_name: input.display_name ?? null,
      status: 'active', current_revision_number: 0, version: 1, created_at: now, updated_at: now, archived_at: null, _agent_workspace_id: agentWs,
      ...(request !== undefined ? { _request: request } : {}),
    };
    try {
      await this.heads.create(ws, doc, { collection: DEPLOYMENT_KEYS, key: doc.key }, DEPLOYMENTS, 'agent deployment');
    } catch (err) {
      if (request === undefined || !(err instanceof ApiError && err.type === 'validation.conflict')) throw err;
      const found = await this.heads.find<DeploymentDoc>(ws, doc.id);
      if (found?._request !== request) throw err;
      return { doc: found, earlier: true };
    }
    crashPoint('agent-deployment-created');
    return { doc, earlier: false };
  }

  get(ws: string, id: string): Promise<DeploymentDoc> {
    return this.heads.get<DeploymentDoc>(ws, id, 'agent deployment');
  }

  list(ws: string, q: { limit?: number | undefined; page?: string | undefined; key?: string | undefined; status?: string | undefined }) {
    const { key, status } = q;
    const filter = key !== undefined || status !== undefined ? (d: DeploymentDoc) => (key === undefined || d.key === key) && (status === undefined || d.status === status) : undefined;
    return this.heads.list<DeploymentDoc>(ws, DEPLOYMENTS, { limit: q.limit ?? 20, page: q.page }, filter);
  }

  /** Archive is terminal: an archived deployment takes no change at all. */
  patch(ws: string, id: string, body: { expected_resource_version: number; display_name?: string | null | undefined; status?: 'active' | 'archived' | undefined }): Promise<DeploymentDoc> {
    return this.heads.update<DeploymentDoc>(ws, id, body.expected_resource_version, (cur) => {
      if (cur.status === 'archived') throw new ApiError('runtime.invalid_transition', 'the deployment is archived (terminal)');
      const next = { ...cur };
      if (body.display_name !== undefined) next.display_name = body.display_name;
      if (body.status === 'archived') {
        next.status = 'archived';
        next.archived_at = nowIso();
      }
      return next.display_name === cur.display_name && next.status === cur.status ? null : next;
    }, 'agent deployment');
  }

  // ---- revisions -----------------------------------------------------------------------------

  async revision(ws: string, id: string, n: number): Promise<RevisionDoc> {
    await this.get(ws, id);
    const r = await this.heads.revision<RevisionDoc>(ws, id, n);
    if (!r) throw new ApiError('validation.not_found', `revision ${n} not found`);
    return r;
  }

  /**
   * Check every pin of a complete snapshot against the Workspace and return the resolved
   * configuration (what the digest covers).
   */
  private async resolve(ws: string, head: DeploymentDoc, body: PublishRevisionInput): Promise<Omit<RevisionDoc, 'id' | 'revision_number' | 'published_by' | 'published_at' | 'agent_deployment_id' | 'workspace_id'>> {
    const d = this.deps();
    const release = await d.agents.getVersion(head._agent_workspace_id, head.agent_id, body.agent_release_number);
    const roster_snapshot = await this.rosterSnapshot(ws, release, body.roster_snapshot);
    const mrp = body.model_routing;
    const routing = await d.models.profiles.getDoc(ws, mrp.model_routing_profile_id);
    await d.models.profiles.revision(ws, mrp.model_routing_profile_id, mrp.model_routing_profile_revision_number, routing);
    const target = body.execution_target;
    let execution_target: ExecutionTargetT;
    if (target.type === 'managed') {
      const hp = await this.harnessProfiles.getVersion(ws, target.harness_profile_id, target.harness_profile_revision_number);
      await this.sandboxProfiles.getVersion(ws, target.sandbox_profile_id, target.sandbox_profile_revision_number);
      if (hp.kind !== 'builtin') throw new ApiError('validation.malformed', 'body.execution_target: a managed target needs a builtin harness profile');
      if (!hp.supported_topologies.includes(target.harness_topology)) {
        throw new ApiError('validation.malformed', `body.execution_target.harness_topology: the harness profile revision supports ${hp.supported_topologies.join(', ')}`);
      }
      if (target.runner_pool_id) await d.runners.getPool(ws, target.runner_pool_id);
      execution_target = { ...target, runner_pool_id: target.runner_pool_id ?? null };
    } else {
      const h = await this.heads.get<ConnectedHarnessDoc>(ws, target.connected_harness_id, 'connected harness');
      if (h.status !== 'active') throw new ApiError('runtime.invalid_transition', 'the connected harness is archived');
      if (h.capability_set_digest !== target.capability_set_digest) {
        throw new ApiError('validation.conflict', 'body.execution_target.capability_set_digest differs from the connected harness registration');
      }
      execution_target = { ...target };
    }
    // Each selection names a live Skill of the Workspace at a version it has, once.
    const skillIds = new Set<string>();
    const skillNames = new Set<string>();
    for (const [i, sel] of body.skill_selections.entries()) {
      if (skillIds.has(sel.skill_id)) throw new ApiError('validation.malformed', `body.skill_selections[${i}]: ${sel.skill_id} is selected twice`);
      skillIds.add(sel.skill_id);
      const skill = await d.skills.get(ws, sel.skill_id);
      if (skill.archived_at !== null) throw new ApiError('validation.not_found', `body.skill_selections[${i}]: skill ${sel.skill_id} is archived`);
      const v = await d.skills.version(sel.skill_id, sel.skill_revision_number);
      if (skillNames.has(v.name)) throw new ApiError('validation.malformed', `body.skill_selections[${i}]: two selections of skill '${v.name}'`);
      skillNames.add(v.name);
    }
    const seen = new Set<string>();
    const bound = new Set<string>();
    for (const sel of body.connection_binding_selections) {
      const id = sel.agent_deployment_connection_binding_id;
      if (seen.has(id)) throw new ApiError('validation.malformed', `body.connection_binding_selections: ${id} is selected twice`);
      seen.add(id);
      const b = await this.heads.find<BindingDoc>(ws, id);
      if (!b || b.agent_deployment_id !== head.id) throw new ApiError('validation.not_found', `connection binding ${id} not found on this deployment`);
      if (b.status !== 'active') throw new ApiError('runtime.invalid_transition', `connection binding ${id} is archived`);
      // One binding shapes a Connection's tools: two would contradict each other.
      if (bound.has(b.integration_connection_id)) throw new ApiError('validation.malformed', `body.connection_binding_selections: two selected bindings bind connection ${b.integration_connection_id}`);
      bound.add(b.integration_connection_id);
      if (!(await this.heads.revision(ws, id, sel.binding_revision_number))) throw new ApiError('validation.not_found', `connection binding ${id} revision ${sel.binding_revision_number} not found`);
    }
    const config = snapshotConfig(head, body, execution_target, roster_snapshot);
    return { ...config, resolved_configuration_sha256: configurationDigest(config) };
  }

  /**
   * A coordinator release (an Agent version with a `multiagent` roster) carries one entry per
   * member in roster order: the member's pinned release and a revision of a deployment of that
   * member in this Workspace running that release (docs/COORDINATION.md). Any other release
   * carries none.
   */
  private async rosterSnapshot(ws: string, release: Agent, input: PublishRevisionInput['roster_snapshot']): Promise<RevisionDoc['roster_snapshot']> {
    const roster = release.multiagent?.roster;
    if (!roster) {
      if (input !== undefined) throw new ApiError('validation.malformed', 'body.roster_snapshot: only a coordinator release carries a roster, and this release is not one');
      return null;
    }
    if (!input) throw new ApiError('validation.malformed', 'body.roster_snapshot: a coordinator release needs its roster snapshot (one entry per member, in roster order)');
    const entries = [...input.entries].sort((a, b) => a.position - b.position);
    if (entries.length !== roster.length) throw new ApiError('validation.malformed', `body.roster_snapshot.entries: the release's roster has ${roster.length} members`);
    for (const [i, e] of entries.entries()) {
      const m = roster[i];
      if (!m || e.position !== i || e.member_agent_id !== m.agent_id || e.member_agent_release_number !== m.version) {
        throw new ApiError('validation.malformed', `body.roster_snapshot.entries: position ${i} must be ${m?.agent_id ?? '?'} release ${m?.version ?? '?'}`);
      }
      const member = await this.heads.find<DeploymentDoc>(ws, e.member_agent_deployment_id);
      if (!member || member.agent_id !== e.member_agent_id) throw new ApiError('validation.not_found', `agent deployment ${e.member_agent_deployment_id} of ${e.member_agent_id} not found`);
      const rev = await this.heads.revision<RevisionDoc>(ws, member.id, e.member_agent_deployment_revision_number);
      if (!rev) throw new ApiError('validation.not_found', `agent deployment ${member.id} revision ${e.member_agent_deployment_revision_number} not found`);
      if (rev.agent_release_number !== e.member_agent_release_number) {
        throw new ApiError('validation.malformed', `body.roster_snapshot.entries: ${member.id} revision ${rev.revision_number} runs release ${rev.agent_release_number}, not ${e.member_agent_release_number}`);
      }
    }
    return { entries };
  }

  /**
   * Publish a complete snapshot as the next revision, under compare-and-swap on the head's
   * resource_version. A replay of the publish that moved the head from `expected_resource_version`
   * with the same resolved configuration returns that revision (200); anything else stale is 409.
   */
  async publish(ws: string, id: string, body: PublishRevisionInput, publishedBy: RevisionDoc['published_by']): Promise<{ status: 200 | 201; revision: RevisionDoc }> {
    const head = await this.get(ws, id);
    const replay = async (digest: string): Promise<RevisionDoc | null> => {
      const n = await this.heads.revisionFromBase(ws, id, body.expected_resource_version);
      const prior = n === null ? null : await this.heads.revision<RevisionDoc>(ws, id, n);
      return prior && prior.resolved_configuration_sha256 === digest ? prior : null;
    };
    if (head.version !== body.expected_resource_version) {
      // A replay is recognised by the snapshot alone, before the pins are checked again: the
      // revision it answers was checked when it was published, and a pin archived since (a
      // binding, a Skill) must not turn the replay into an error.
      const prior = await replay(configurationDigest(requestedConfig(head, body)));
      if (prior) return { status: 200, revision: prior };
      throw new ApiError('validation.conflict', `resource_version ${body.expected_resource_version} ${staleOrAhead(body.expected_resource_version, head.version)}; the current resource_version is ${head.version}`);
    }
    // A terminal head refuses before its references are checked: no reference makes it publishable.
    if (head.status === 'archived') throw new ApiError('runtime.invalid_transition', 'the deployment is archived (terminal)');
    const resolved = await this.resolve(ws, head, body);
    // A revision that repeats the current one changes nothing: the current revision is answered
    // as it is (200), the head's resource_version kept, as any update that changes nothing is.
    if (head.current_revision_number > 0) {
      const current = await this.heads.revision<RevisionDoc>(ws, id, head.current_revision_number);
      if (current && current.resolved_configuration_sha256 === resolved.resolved_configuration_sha256) return { status: 200, revision: current };
    }
    const n = head.current_revision_number + 1;
    const now = nowIso();
    const revision: RevisionDoc = {
      id: revisionId(id, n), agent_deployment_id: id, workspace_id: ws, revision_number: n, ...resolved, published_by: publishedBy, published_at: now,
    };
    const next: DeploymentDoc = { ...head, current_revision_number: n, version: head.version + 1, updated_at: now };
    const r = await this.heads.publish(ws, head, n, revision, next);
    if (r === 'written') return { status: 201, revision };
    if (r === 'missing') throw new ApiError('validation.not_found', 'agent deployment not found');
    if (r === 'archived') throw new ApiError('runtime.invalid_transition', 'the deployment is archived (terminal)');
    const prior = await replay(resolved.resolved_configuration_sha256);
    if (prior) return { status: 200, revision: prior };
    throw new ApiError('validation.conflict', `resource_version ${body.expected_resource_version} is stale: another revision was published concurrently`);
  }

  async listRevisions(ws: string, id: string, q: { limit?: number | undefined; page?: string | undefined }) {
    const head = await this.get(ws, id);
    // A cursor names the last revision of the page it ended: one this deployment has published.
    const after = q.page ? decodeNumberCursor(q.page, 1, head.current_revision_number) : 0;
    const r = await this.heads.listRevisions<RevisionDoc>(ws, id, { limit: q.limit ?? 20, after });
    return { data: r.data, next_page: r.more && r.last !== null ? `c1_${r.last.toString(36)}` : null };
  }

  // ---- deploy --------------------------------------------------------------------------------

  /**
   * `POST /v1/agents/{id}/deploy`: ensure the target Workspace's deployment (key
   * `agent-<agent_id>`), then publish an exact-pin revision only when the target holds every
   * profile the release names; repeating converges on the same head (and revision).
   */
  async deploy(sourceWs: string, agentId: string, release: number, targetWs: string): Promise<{ outcome: 'published' | 'unchanged' | 'head_only'; agent_deployment: DeploymentDoc; revision: RevisionDoc | null; missing_profiles: string[] }> {
    const d = this.deps();
    const agent: Agent = await d.agents.getVersion(sourceWs, agentId, release);
    const id = deploymentId(targetWs, agentId);
    // A coordinator release needs its members resolved to deployment revisions: deploy leaves the head only.
    const coordinator = agent.multiagent !== undefined;
    let head = await this.heads.find<DeploymentDoc>(targetWs, id);
    if (!head) {
      try {
        head = (await this.create(targetWs, { agent_id: agentId, key: `agent-${agentId}` }, sourceWs)).doc;
      } catch (err) {
        head = await this.heads.find<DeploymentDoc>(targetWs, id);
        if (!head) throw err;
      }
    }
    if (head.status === 'archived') throw new ApiError('runtime.invalid_transition', 'the target deployment is archived (terminal)');
    // The profiles a release names, by logical key in the target Workspace.
    const harnessKey = agent.metadata.harness_profile_key ?? 'default';
    const sandboxKey = agent.metadata.sandbox_profile_key ?? 'default';
    await d.models.profiles.ensureDefaults(targetWs);
    const [routing, harnessId, sandboxId] = await Promise.all([
      d.models.profiles.resolve(targetWs, agent.model),
      this.heads.idByKey(targetWs, HARNESS_PROFILE_KEYS, harnessKey),
      this.heads.idByKey(targetWs, SANDBOX_PROFILE_KEYS, sandboxKey),
    ]);
    const harness = harnessId ? await this.harnessProfiles.get(targetWs, harnessId).catch(() => null) : null;
    const sandbox = sandboxId ? await this.sandboxProfiles.get(targetWs, sandboxId).catch(() => null) : null;
    const missing: string[] = [];
    if (!routing) missing.push(`model_routing_profile:${agent.model}`);
    if (!harness || harness.archived_at !== null || harness.kind !== 'builtin') missing.push(`harness_profile:${harnessKey}`);
    if (!sandbox || sandbox.archived_at !== null) missing.push(`sandbox_profile:${sandboxKey}`);
    // The skills the release selects, by name and version in the target Workspace: a revision's
    // selections take the place of the release's own, so leaving them out would run without them.
    const skillSelections: PublishRevisionInput['skill_selections'] = [];
    for (const sel of agent.skills ?? []) {
      const skill = await d.skills.reader.byName(targetWs, sel.name);
      const version = skill && skill.archived_at === null ? await d.skills.reader.version(skill.id, sel.version) : null;
      if (skill && version) skillSelections.push({ skill_id: skill.id, skill_revision_number: version.version });
      else missing.push(`skill:${sel.name}@${sel.version}`);
    }
    if (coordinator || missing.length > 0 || !routing || !harness || !sandbox) return { outcome: 'head_only', agent_deployment: head, revision: null, missing_profiles: missing };

    const bindings = await this.heads.list<BindingDoc>(targetWs, BINDINGS(id), { limit: 64 }, (b) => b.status === 'active' && b.current_revision_number > 0);
    for (let attempt = 0; attempt < 4; attempt++) {
      const body: PublishRevisionInput = {
        expected_resource_version: head.version,
        agent_release_number: release,
        model_routing: { model_routing_profile_id: routing.profile.id, model_routing_profile_revision_number: routing.revision.revision_number },
        execution_target: {
          type: 'managed', harness_profile_id: harness.id, harness_profile_revision_number: harness.version, sandbox_profile_id: sandbox.id,
          sandbox_profile_revision_number: sandbox.version, runner_pool_id: null,
          harness_topology: harness.supported_topologies.includes('split') ? 'split' : 'colocated',
        },
        skill_selections: skillSelections,
        // The oldest active binding of each Connection (a revision selects one per Connection).
        connection_binding_selections: bindings.data
          .filter((b, i, all) => all.findIndex((x) => x.integration_connection_id === b.integration_connection_id) === i)
          .map((b) => ({ agent_deployment_connection_binding_id: b.id, binding_revision_number: b.current_revision_number })),
      };
      const current = head.current_revision_number > 0 ? await this.heads.revision<RevisionDoc>(targetWs, id, head.current_revision_number) : null;
      const resolved = await this.resolve(targetWs, head, body);
      if (current && current.resolved_configuration_sha256 === resolved.resolved_configuration_sha256) {
        return { outcome: 'unchanged', agent_deployment: head, revision: current, missing_profiles: [] };
      }
      try {
        const r = await this.publish(targetWs, id, body, { kind: 'system' });
        // 200: a concurrent deploy published this same configuration from the same head; this
        // one wrote nothing.
        return { outcome: r.status === 201 ? 'published' : 'unchanged', agent_deployment: await this.get(targetWs, id), revision: r.revision, missing_profiles: [] };
      } catch (err) {
        if (!(err instanceof ApiError) || err.type !== 'validation.conflict') throw err;
        head = await this.get(targetWs, id);
      }
    }
    throw new ApiError('validation.conflict', 'the deployment kept changing while deploying; nothing more was written, retry');
  }

  // ---- Sessions against a deployment -----------------------------------------------------------

  /** What a new Session gets from the deployment's current revision. */
  async sessionPin(ws: string, id: string) {
    const head = await this.get(ws, id);
    if (head.status === 'archived') throw new ApiError('runtime.invalid_transition', 'the deployment is archived (terminal)');
    if (head.current_revision_number === 0) throw new ApiError('runtime.invalid_transition', 'the deployment has no revision yet (current_revision_number 0)');
    const rev = await this.revision(ws, id, head.current_revision_number);
    const target = rev.execution_target;
    if (target.type !== 'managed') throw new ApiError('runtime.invalid_transition', 'Sessions on a connected harness are not served yet');
    const agentVersion = await this.deps().agents.getVersion(head._agent_workspace_id, rev.agent_id, rev.agent_release_number);
    const routing = await this.deps().models.profiles.getDoc(ws, rev.model_routing_profile_id);
    const pin: DeploymentPin = {
      agent_deployment_id: id, agent_deployment_revision_id: rev.id, revision_number: rev.revision_number,
      runner_pool_id: target.runner_pool_id ?? null, harness_topology: target.harness_topology,
      harness_profile_id: target.harness_profile_id, harness_profile_revision_number: target.harness_profile_revision_number,
      model_routing_profile_id: rev.model_routing_profile_id, model_routing_profile_revision_number: rev.model_routing_profile_revision_number,
      connection_binding_selections: rev.connection_binding_selections,
    };
    // The agent's model steps go through the routing profile the revision pins: its key, and the
    // model gateway resolves the pinned revision for this Session (not the profile's latest).
    // The revision's skill selections are the Runs' skills (in place of the Agent version's own).
    const skills = await Promise.all(rev.skill_selections.map(async (sel) => {
      const v = await this.deps().skills.version(sel.skill_id, sel.skill_revision_number);
      return { name: v.name, version: v.version };
    }));
    const { skills: _own, ...snapshot } = snapshotOf(agentVersion);
    return { agent: { ...snapshot, ...(skills.length > 0 ? { skills } : {}), model: routing.key }, sandbox: { id: target.sandbox_profile_id, version: target.sandbox_profile_revision_number }, pin };
  }

  // ---- connection bindings -------------------------------------------------------------------

  async createBinding(
    ws: string, adep: string, input: { integration_connection_id: string; key: string; display_name?: string | null | undefined }, id = newId('agentDeploymentConnectionBinding'),
  ): Promise<BindingDoc> {
    const head = await this.get(ws, adep);
    if (head.status === 'archived') throw new ApiError('runtime.invalid_transition', 'the deployment is archived (terminal)');
    await new ConnectionService(this.d.docs, this.d.secretBox).get(ws, input.integration_connection_id);
    const now = nowIso();
    const doc: BindingDoc = {
      id, workspace_id: ws, agent_deployment_id: adep, integration_connection_id: input.integration_connection_id,
      key: input.key, display_name: input.display_name ?? null, status: 'active', current_revision_number: 0, version: 1, created_at: now, updated_at: now,
    };
    await this.heads.create(ws, doc, { collection: BINDING_KEYS(adep), key: doc.key, within: `agent deployment ${adep}` }, BINDINGS(adep), 'connection binding');
    return doc;
  }

  /** The connection binding of deployment `adep` stored under `id` in the Workspace; null when there is none. */
  async findBinding(ws: string, adep: string, id: string): Promise<BindingDoc | null> {
    const d = await this.heads.find<BindingDoc>(ws, id);
    return d && d.agent_deployment_id === adep ? d : null;
  }

  getBinding(ws: string, id: string): Promise<BindingDoc> {
    return this.heads.get<BindingDoc>(ws, id, 'connection binding');
  }

  /** Archive is terminal, the binding's and its deployment's: a binding of an archived deployment takes no change. */
  async patchBinding(ws: string, id: string, body: { expected_resource_version: number; display_name?: string | null | undefined; status?: 'active' | 'archived' | undefined }): Promise<BindingDoc> {
    const parent = await this.bindingDeployment(ws, await this.getBinding(ws, id));
    return this.heads.update<BindingDoc>(ws, id, body.expected_resource_version, (cur) => {
      if (cur.status === 'archived') throw new ApiError('runtime.invalid_transition', 'the connection binding is archived (terminal)');
      if (parent.status === 'archived') throw deploymentArchived();
      const next = { ...cur };
      if (body.display_name !== undefined) next.display_name = body.display_name;
      if (body.status !== undefined) next.status = body.status;
      return next.display_name === cur.display_name && next.status === cur.status ? null : next;
    }, 'connection binding');
  }

  /**
   * The next binding revision. `expected_resource_version` fences it (an identical replay of the
   * publish that moved the head from it answers that revision, 200); without it, the head as read.
   * `keyed`: published once per keyed request: the revision an earlier attempt of the request
   * published (its process died before the answer was kept) answers it (201), whatever the head
   * now says, and is not published again as the next revision.
   */
  async publishBinding(
    ws: string, id: string,
    body: { expected_resource_version?: number | undefined; tool_selection: string[]; tool_aliases: Record<string, string>; argument_policy: 'default' | 'strict' },
    keyed?: KeyedWrite,
  ): Promise<{ status: 200 | 201; revision: BindingRevisionDoc }> {
    for (const name of Object.keys(body.tool_aliases)) {
      if (!body.tool_selection.includes(name)) throw new ApiError('validation.malformed', `body.tool_aliases.${name}: aliases only name selected tools`);
    }
    const clash = exposedNameClash(body.tool_selection, body.tool_aliases);
    if (clash !== null) throw new ApiError('validation.malformed', `body.tool_aliases: two selected tools would both be offered as '${clash}'`);
    const content = { tool_selection: body.tool_selection, tool_aliases: body.tool_aliases, argument_policy: body.argument_policy };
    const same = (r: BindingRevisionDoc | null) => r !== null && canonicalJson({ tool_selection: r.tool_selection, tool_aliases: r.tool_aliases, argument_policy: r.argument_policy }) === canonicalJson(content);
    const earlier = keyed ? await this.heads.published(ws, keyed) : null;
    if (earlier !== null) return { status: 201, revision: await this.bindingRevision(ws, id, earlier) };
    for (let attempt = 0; attempt < 8; attempt++) {
      const head = await this.getBinding(ws, id);
      const expected = body.expected_resource_version ?? head.version;
      if (head.version !== expected) {
        const n = await this.heads.revisionFromBase(ws, id, expected);
        const prior = n === null ? null : await this.heads.revision<BindingRevisionDoc>(ws, id, n);
        if (prior && same(prior)) return { status: 200, revision: prior };
        throw new ApiError('validation.conflict', `resource_version ${expected} ${staleOrAhead(expected, head.version)}; the current resource_version is ${head.version}`);
      }
      if (head.status === 'archived') throw new ApiError('runtime.invalid_transition', 'the connection binding is archived (terminal)');
      if ((await this.bindingDeployment(ws, head)).status === 'archived') throw deploymentArchived();
      const n = head.current_revision_number + 1;
      const now = nowIso();
      const revision: BindingRevisionDoc = { agent_deployment_connection_binding_id: id, workspace_id: ws, binding_revision_number: n, ...content, published_at: now };
      const r = await this.heads.publish(ws, head, n, revision, { ...head, current_revision_number: n, version: head.version + 1, updated_at: now }, keyed);
      if (typeof r === 'object') return { status: 201, revision: await this.bindingRevision(ws, id, r.earlier) };
      if (r === 'written') {
        crashPoint('connection-binding-revision-published');
        return { status: 201, revision };
      }
      if (r === 'missing') throw new ApiError('validation.not_found', 'connection binding not found');
      if (r === 'archived') throw new ApiError('runtime.invalid_transition', 'the connection binding is archived (terminal)');
      if (body.expected_resource_version !== undefined) continue; // re-read: replay or 409 above
    }
    throw new ApiError('validation.conflict', 'too much contention on this binding; nothing was written, retry');
  }

  /** The deployment a binding belongs to (its head as stored now). */
  private bindingDeployment(ws: string, binding: BindingDoc): Promise<DeploymentDoc> {
    return this.get(ws, binding.agent_deployment_id);
  }

  async bindingRevision(ws: string, id: string, n: number): Promise<BindingRevisionDoc> {
    await this.getBinding(ws, id);
    const r = await this.heads.revision<BindingRevisionDoc>(ws, id, n);
    if (!r) throw new ApiError('validation.not_found', `binding revision ${n} not found`);
    return r;
  }

  // ---- connected harnesses -------------------------------------------------------------------

  async createConnectedHarness(ws: string, input: { key: string; display_name?: string | null | undefined; capability_set_digest: string }, id = newId('connectedHarness')): Promise<ConnectedHarnessDoc> {
    const now = nowIso();
    const doc: ConnectedHarnessDoc = {
      id, workspace_id: ws, key: input.key, display_name: input.display_name ?? null,
      capability_set_digest: input.capability_set_digest, status: 'active', current_revision_number: 0, version: 1, created_at: now, updated_at: now,
    };
    await this.heads.create(ws, doc, { collection: HARNESS_KEYS, key: doc.key }, HARNESSES, 'connected harness');
    return doc;
  }

  /** The ConnectedHarness stored under `id` in the Workspace; null when there is none. */
  findConnectedHarness(ws: string, id: string): Promise<ConnectedHarnessDoc | null> {
    return this.heads.find<ConnectedHarnessDoc>(ws, id);
  }

  getConnectedHarness(ws: string, id: string): Promise<ConnectedHarnessDoc> {
    return this.heads.get<ConnectedHarnessDoc>(ws, id, 'connected harness');
  }

  listConnectedHarnesses(ws: string, q: { limit?: number | undefined; page?: string | undefined }) {
    return this.heads.list<ConnectedHarnessDoc>(ws, HARNESSES, { limit: q.limit ?? 20, page: q.page });
  }

  // ---- profiles ------------------------------------------------------------------------------

  /**
   * Revision 1 and the head, with the profile's Workspace-unique key claimed in the same script
   * (409 `validation.conflict` when another profile holds it): a creation that dies midway leaves
   * no key claimed by a profile that does not exist. With an Idempotency-Key, made once however many
   * times the request is sent (`createVersioned`): a retry whose first attempt died after writing is
   * answered that profile, not refused for its key.
   */
  createProfile<T extends HarnessProfile | SandboxProfile>(store: VersionedStore<T>, uniq: string, doc: T, keyed: KeyedRequest | undefined): Promise<T> {
    const harness = doc.type === 'harness_profile';
    return createVersioned(store, doc.workspace_id, doc, harness ? 'harnessProfile' : 'sandboxProfile', keyed,
      harness ? 'harness-profile-key-claimed' : 'sandbox-profile-key-claimed', { collection: uniq, key: doc.key });
  }

  async listProfiles<T extends HarnessProfile | SandboxProfile>(store: VersionedStore<T>, uniq: string, ws: string, q: { limit?: number | undefined; page?: string | undefined; key?: string | undefined }) {
    if (q.key !== undefined) {
      const id = await store.idByKey(ws, { collection: uniq, key: q.key });
      const doc = id ? await store.get(ws, id).catch(() => null) : null;
      return { data: doc ? [doc] : [], next_page: null };
    }
    return store.list(ws, { limit: q.limit ?? 20, page: q.page, includeArchived: false });
  }
}

/** The resolved configuration of a snapshot (what its digest covers), from its checked parts. */
function snapshotConfig(head: DeploymentDoc, body: PublishRevisionInput, execution_target: ExecutionTargetT, roster_snapshot: RevisionDoc['roster_snapshot']) {
  return {
    agent_id: head.agent_id,
    agent_release_number: body.agent_release_number,
    model_routing_profile_id: body.model_routing.model_routing_profile_id,
    model_routing_profile_revision_number: body.model_routing.model_routing_profile_revision_number,
    execution_target,
    skill_selections: body.skill_selections,
    connection_binding_selections: body.connection_binding_selections,
    roster_snapshot,
  };
}

/**
 * The configuration a snapshot asks for, as `resolve` would make it once its pins check out
 * (`runner_pool_id` made explicit, roster entries in position order), without checking them.
 */
function requestedConfig(head: DeploymentDoc, body: PublishRevisionInput) {
  const target = body.execution_target;
  const execution_target: ExecutionTargetT = target.type === 'managed' ? { ...target, runner_pool_id: target.runner_pool_id ?? null } : { ...target };
  const roster = body.roster_snapshot ? { entries: [...body.roster_snapshot.entries].sort((a, b) => a.position - b.position) } : null;
  return snapshotConfig(head, body, execution_target, roster);
}

const deploymentArchived = (): ApiError => new ApiError('runtime.invalid_transition', 'the deployment is archived (terminal)');

/** `c1_<n in base 36>` as this list writes it (no leading zeros), with `min <= n <= max`; else 400. */
function decodeNumberCursor(cursor: string, min = 0, max = Number.MAX_SAFE_INTEGER): number {
  const m = /^c1_([0-9a-z]+)$/.exec(cursor);
  const n = m?.[1] ? parseInt(m[1], 36) : NaN;
  if (!Number.isSafeInteger(n) || n < min || n > max || n.toString(36) !== m?.[1]) throw new ApiError('validation.malformed', 'query.page: not a cursor issued by this list');
  return n;
}
