import type { TokenUsage } from '@agentplane/protocol';
import { ApiError, canonicalJson, crashPoint, newId, nowIso, sha256Hex, type Context } from '@agentplane/core';
import { getEach, keys, newEventId, SEQ_PLACEHOLDER, tags, type LogEvent } from '@agentplane/store';
import { checkMultiagent, newAgent, snapshotOf, type Agent, type AgentSnapshot, type DeploymentPin, type SpecSkill } from '@agentplane/domain';
import type { VersionedStore } from '@agentplane/domain';
import type { Environment } from '@agentplane/domain';
import type { IdentityService } from '@agentplane/domain';
import {
  publicDoc, sessionStats, threadStats, usageFrom, type SessionDoc, type SessionTombstone, type Usage, type SessionResource, type ThreadDoc, type WaitKind,
} from '@agentplane/domain';
import { checkDrivePayload, type CreateSessionInput, type DriveEventType, type DrivePayload } from './schemas.js';
import { inputQueueKey, newThreadDoc, SessionStore } from '@agentplane/domain';
import type { ThreadRuntime, TurnScheduler } from '@agentplane/domain';
import type { FileStore } from '@agentplane/domain';
import type { MemoryStores } from '../memory/store.js';
import type { VaultService } from '../vaults/service.js';
import type { ProjectService } from '../projects/service.js';
import type { KeyedRequest } from '../http/idempotency.js';

export interface SessionServiceDeps {
  store: SessionStore;
  agents: VersionedStore<Agent>;
  environments: VersionedStore<Environment>;
  identity: IdentityService;
  /** For `file` resources: the File must exist in the Session's Workspace. */
  files?: FileStore;
  /** Memory resources must name a MemoryStore of the Workspace. */
  memory?: MemoryStores;
  /** `vault_ids` must name Vaults of the Workspace. */
  vaults?: VaultService;
  /** `uploaded_project` resources must name a Project (and revision) of the Workspace. */
  projects?: ProjectService;
  runtime: ThreadRuntime;
  scheduler: () => TurnScheduler;
  /** Refuses a new turn when a budget (Session or workspace) is spent: 429 `budget.exceeded`. */
  admitTurn?: (session: Pick<SessionDoc, 'id' | 'workspace_id' | 'budget'>) => Promise<void>;
  /** Refuses an inline agent whose `model` names no routing profile of the workspace (422 `model.no_eligible_model`). */
  requireModel?: (ws: string, key: string, field: string) => Promise<void>;
  /** An inline agent's skill selections must name Skills of the Workspace (404 otherwise). */
  checkSkills?: (ws: string, selections: ReadonlyArray<{ name: string; version: number }>, field: string) => Promise<void>;
  /** Token usage metered by the model gateway, per Session or thread (null: none recorded). */
  modelUsage?: (scope: { session_id: string; thread_id?: string }) => Promise<TokenUsage | null>;
  /** `user.define_outcome` (docs/OUTCOMES.md); absent: the event is only recorded. */
  outcomes?: OutcomeDriver;
}

/** What the Sessions module asks of the outcomes module. */
export interface OutcomeDriver {
  /** Before a new Session with a define in its initial events is written: refuses what the thread cannot take. */
  admit(session: SessionDoc, thread: ThreadDoc, payload: DrivePayload): Promise<void>;
  /**
   * A define event for an existing Session: checked as `admit`, then appended in the same step
   * that takes the thread and starts the outcome's first turn (of two defines sent together, one
   * only is written: the other is 409). A producer key that names an earlier append answers its
   * event, also when that append was made meanwhile by the same request sent twice at once.
   */
  appendDefine(session: SessionDoc, thread: ThreadDoc, payload: DrivePayload, producerKey: string | undefined, trace?: Context): Promise<LogEvent>;
  /**
   * A new Session's initial events holding a define: appended with the outcome and its first turn
   * (every initial event its input) in one step. `producerKey`: the create's batch key.
   */
  defineInNewSession(session: SessionDoc, thread: ThreadDoc, initial: ReadonlyArray<{ type: string; payload: DrivePayload }>, producerKey: string | undefined, trace?: Context): Promise<LogEvent[]>;
  /**
   * After it is appended: records the outcome and starts its first turn, unless the define's own
   * commit already did both (an outcome with `first_run_id`: then nothing is left to do).
   */
  defined(session: SessionDoc, threadId: string, event: LogEvent, trace?: Context): Promise<unknown>;
  /**
   * The Session was archived: an outcome whose thread waits on an answer (which an archived
   * Session no longer takes) ends `interrupted` now, before the Session's terminal status event.
   */
  sessionArchived?(session: SessionDoc): Promise<void>;
}

/** The create body; `agent` and `environment_id` are absent only for a Session created against a deployment. */
export type SessionCreateBody = Omit<CreateSessionInput, 'agent' | 'environment_id'> & Partial<Pick<CreateSessionInput, 'agent' | 'environment_id'>>;

/** A keyed create's derived Session id, request fingerprint and the key's record lifetime (`KeyedRequest`). */
export interface KeyedSession {
  id: string;
  /** The id of an inline configuration's Agent: derived from the key and the request's fingerprint (another request under the key names another). */
  agentId: string;
  fingerprint: string;
  keptMs: number;
}

/** What a keyed Session create (`POST /v1/sessions`, a deployment's Session) makes its ids from. */
export function keyedSession(keyed: KeyedRequest | undefined): { keyed?: KeyedSession } {
  return keyed ? { keyed: { id: keyed.id('session'), agentId: keyed.id('agent', keyed.fingerprint), fingerprint: keyed.fingerprint, keptMs: keyed.keptMs } } : {};
}

export interface DriveInput {
  type: DriveEventType;
  payload: DrivePayload;
}

export interface DriveOutcome {
  status: 200 | 201;
  event: LogEvent;
}

const ANSWER_TYPE: Record<Exclude<WaitKind, 'approval' | 'delegation'>, DriveEventType> = { custom_tool: 'user.custom_tool_result', confirmation: 'user.tool_confirmation', question: 'user.question_answer' };

interface Position {
  score: number;
  member: string;
}

/**
 * A Session list cursor: `c1_` and the hex of `<dir>|<binding>|<score>|<member>`. The binding
 * (16 hex digits of a SHA-256 of the Workspace, the order and the filters) names the list that
 * issued it: the same cursor sent with another order or other filters is 400, not a position
 * read in a list it does not belong to (which would skip or repeat Sessions).
 */
function listBinding(ws: string, q: Record<string, unknown>): string {
  // Defaults as the list applies them: the same list asked with or without them is the same list.
  const instant = (v: unknown) => (typeof v === 'string' ? Date.parse(v) : null);
  const fields = [q.order ?? 'desc', q.include_archived === true, q.agent_id ?? null, q.automation_id ?? null, instant(q.created_after), instant(q.created_before)];
  return sha256Hex(canonicalJson(['sessions', ws, ...fields])).slice(0, 16);
}
function encodePos(dir: 'n' | 'p', bound: string, pos: Position): string {
  return `c1_${Buffer.from(`${dir}|${bound}|${pos.score}|${pos.member}`, 'utf8').toString('hex')}`;
}
function decodePos(cursor: string, bound: string): { dir: 'n' | 'p'; pos: Position } {
  const m = /^c1_([0-9a-f]+)$/.exec(cursor);
  const parts = m?.[1] && m[1].length % 2 === 0 ? Buffer.from(m[1], 'hex').toString('utf8').split('|') : [];
  const [dir, binding, score, member] = parts;
  if (parts.length === 4 && (dir === 'n' || dir === 'p') && binding && score !== undefined && score !== '' && Number.isFinite(Number(score)) && member) {
    if (binding !== bound) throw new ApiError('validation.malformed', 'query.page: a cursor of this list with another order or other filters; send the query it was issued for');
    return { dir, pos: { score: Number(score), member } };
  }
  throw new ApiError('validation.malformed', 'query.page: not a cursor issued by this list');
}

export class SessionService {
  constructor(private readonly d: SessionServiceDeps) {}

  get store(): SessionStore {
    return this.d.store;
  }

  // ---- create --------------------------------------------------------------------------------

  /**
   * The Agent snapshot a create pins. An inline configuration is checked and made a new Agent
   * (version 1) here but not written: `pending` is that Agent, which the create writes
   * (`writeAgent`) only once every other check passed, so a refused create leaves no Agent.
   * `keyedId`: a keyed create's id for the inline configuration's Agent, derived from its key and
   * request: the retry of a create that died after writing that Agent takes it (version 1, as
   * that same request wrote it) instead of writing a second one.
   */
  private async resolveAgent(ws: string, input: CreateSessionInput['agent'], keyedId?: string): Promise<{ snapshot: AgentSnapshot; pending?: Agent }> {
    if (typeof input === 'string' || 'id' in input) {
      const id = typeof input === 'string' ? input : input.id;
      const version = typeof input === 'string' ? undefined : input.version;
      const agent = version !== undefined ? await this.d.agents.getVersion(ws, id, version) : await this.d.agents.get(ws, id);
      if (version === undefined && agent.archived_at !== null) throw new ApiError('runtime.invalid_transition', 'the agent is archived');
      return { snapshot: snapshotOf(agent) };
    }
    // Inline configuration: recorded as a new Agent (version 1) so the snapshot is addressable.
    await this.d.requireModel?.(ws, input.model, 'body.agent.model');
    if (input.skills) await this.d.checkSkills?.(ws, input.skills, 'body.agent.skills');
    if (input.multiagent) await checkMultiagent(input.multiagent, input.tools ?? [], (id, v) => this.d.agents.getVersion(ws, id, v), 'body.agent.multiagent');
    if (keyedId) {
      const earlier = await this.keyedAgent(ws, keyedId);
      if (earlier) return { snapshot: snapshotOf(earlier) };
    }
    const pending = { ...newAgent(ws, input), ...(keyedId ? { id: keyedId } : {}) };
    return { snapshot: snapshotOf(pending), pending };
  }

  /** Version 1 of a keyed create's inline Agent, as an earlier attempt of the same request wrote it; null when none did. */
  private keyedAgent(ws: string, keyedId: string): Promise<Agent | null> {
    return this.d.agents.getVersion(ws, keyedId, 1).catch((err: unknown) => {
      if (err instanceof ApiError && err.type === 'validation.not_found') return null;
      throw err;
    });
  }

  /**
   * Writes an inline configuration's Agent, after the create's last check. A keyed create whose
   * other attempt (the same request) wrote it meanwhile takes that one: its snapshot is the same
   * configuration under the same id.
   */
  private async writeAgent(ws: string, pending: Agent, keyed: boolean): Promise<AgentSnapshot> {
    try {
      await this.d.agents.create(ws, pending);
    } catch (err) {
      const earlier = keyed && err instanceof ApiError && err.type === 'validation.conflict' ? await this.keyedAgent(ws, pending.id) : null;
      if (!earlier) throw err;
      return snapshotOf(earlier);
    }
    crashPoint('session-agent-created');
    return snapshotOf(pending);
  }

  /**
   * `options.automationId`: set by the automations module when a firing creates the Session.
   * `options.deployment`: a Session created against an AgentDeployment revision: the agent and the
   * sandbox come from the revision's pins instead of `body.agent` / `body.environment_id`.
   */
  async create(
    ws: string,
    body: SessionCreateBody,
    idemKey: string | undefined,
    options: {
      automationId?: string; deployment?: { agent: AgentSnapshot; sandbox: { id: string; version: number }; pin: DeploymentPin };
      /** An id reserved before the create (a skill verification): a Session that already has it is returned as it is. */
      id?: string;
      /**
       * A create under an Idempotency-Key: the Session's id derived from the key and the request's
       * fingerprint (`KeyedRequest`). A Session that an earlier attempt under the key wrote (its
       * process died before it answered) is that attempt's answer: its initial events are
       * appended if they were not, and it is returned; another request under the key is 409.
       */
      keyed?: KeyedSession;
      /** Skills every Run of the Session places beside the Agent's (a skill verification's drafted skill). */
      skills?: SpecSkill[];
      /** The trace context of the request creating it (the parent of its initial events' spans). */
      trace?: Context | undefined;
    } = {},
  ): Promise<Record<string, unknown>> {
    if (options.id) {
      const existing = await this.d.store.docs.get<SessionDoc>(tags.session(options.id), options.id);
      if (existing) {
        // Listed again: its create may have died between its documents and the Workspace's lists.
        if (existing.type === 'session') await this.d.store.listed(existing);
        return this.view(existing);
      }
    }
    const initial = (body.initial_events ?? []).map((e, i) => ({ type: e.type, payload: checkDrivePayload(e.type, e.payload, `body.initial_events.${i}`) }));
    for (const e of initial) {
      if (e.type !== 'user.message' && e.type !== 'user.define_outcome') {
        throw new ApiError('validation.malformed', `initial_events: '${e.type}' needs a running Session; only user.message and user.define_outcome are accepted`);
      }
      if (e.payload.session_thread_id !== undefined) throw new ApiError('validation.malformed', 'initial_events: session_thread_id is not accepted (the primary thread does not exist yet)');
    }
    const outcomes = initial.filter((e) => e.type === 'user.define_outcome');
    if (outcomes.length > 1) throw new ApiError('validation.malformed', 'initial_events: at most one user.define_outcome');
    const producerKey = idemKey ? `create:${sha256Hex(idemKey)}` : undefined;
    let keyed = options.id ? undefined : options.keyed;
    if (keyed) {
      const found = await this.d.store.docs.get<SessionDoc | SessionTombstone>(tags.session(keyed.id), keyed.id);
      const earlier = found ? this.keyedEarlier(ws, found, keyed) : null;
      if (earlier === 'stale') keyed = undefined;
      else if (earlier) return this.resume(earlier, initial, producerKey, options.trace);
    }
    await Promise.all([...new Set(initial.map((e) => e.payload.authored_by))].map((p) => this.d.identity.activePrincipal(ws, p, 'authored_by')));
    await this.checkResources(ws, body.resources ?? []);
    await this.d.vaults?.requireAll(ws, body.vault_ids ?? []);
    const id = options.id ?? keyed?.id ?? newId('session');
    const budget: SessionDoc['budget'] = body.budget ? { max_list_cost: { amount: body.budget.max_list_cost.amount, currency: 'USD' } } : null;
    // A first user.message starts a turn: a spent Session or Workspace budget refuses the create,
    // before anything is written (an inline agent's Agent among them).
    if (initial.some((e) => e.type === 'user.message' || e.type === 'user.define_outcome')) await this.d.admitTurn?.({ id, workspace_id: ws, budget });
    let env: { id: string; version: number };
    let agent: AgentSnapshot;
    // An inline configuration's Agent: written after the last check below, never by a refused create.
    let pendingAgent: Agent | undefined;
    if (options.deployment) {
      env = options.deployment.sandbox;
      agent = options.deployment.agent;
    } else {
      if (body.agent === undefined || body.environment_id === undefined) throw new ApiError('validation.malformed', 'body: agent and environment_id are required');
      const current = await this.d.environments.get(ws, body.environment_id);
      if (current.archived_at !== null) throw new ApiError('runtime.invalid_transition', 'the environment is archived');
      env = current;
      ({ snapshot: agent, pending: pendingAgent } = await this.resolveAgent(ws, body.agent, keyed ? keyed.agentId : undefined));
    }
    const now = nowIso();
    const primary = newThreadDoc({ id, workspace_id: ws, created_at: now }, agent, null);
    const session: SessionDoc = {
      id, type: 'session', workspace_id: ws, agent, environment_id: env.id, environment_version: env.version,
      title: body.title ?? null, budget,
      metadata: body.metadata ?? {}, resources: (body.resources ?? []).map((r) => this.newResource(r)), vault_ids: body.vault_ids ?? [],
      outcome_evaluations: [], archived_at: null, _primary_thread_id: primary.id, version: 1, created_at: now, updated_at: now,
      ...(options.automationId ? { automation_id: options.automationId } : {}),
      ...(options.deployment ? { agent_deployment: options.deployment.pin } : {}),
      ...(options.skills && options.skills.length > 0 ? { _skills: options.skills } : {}),
      ...(keyed ? { _keyed_fingerprint: keyed.fingerprint } : {}),
    };
    if (outcomes[0] && this.d.outcomes) await this.d.outcomes.admit(session, primary, outcomes[0].payload);
    if (pendingAgent) session.agent = primary.agent = await this.writeAgent(ws, pendingAgent, keyed !== undefined);
    const existing = await this.d.store.create(session, primary);
    if (existing) {
      // The same keyed create, still running in a process whose key's pending record lapsed, wrote it first.
      const earlier = keyed ? this.keyedEarlier(ws, existing, keyed) : null;
      if (earlier && earlier !== 'stale') return this.resume(earlier, initial, producerKey, options.trace);
      // A reserved id's Session, written meanwhile by the same reservation's other attempt.
      if (options.id && existing.type === 'session') return this.view(existing);
      throw new ApiError('validation.conflict', `a session with id ${id} exists already`);
    }
    crashPoint('session-created');
    await this.appendInitial(session, primary, initial, producerKey, options.trace, false);
    return this.view(session);
  }

  /**
   * What a document found under a keyed create's derived id is to that create: the Session an
   * earlier attempt of the same request wrote (its answer); `stale` when it was written by an
   * earlier use of the key whose record has lapsed (the key is free again: this create takes a
   * new id). Another request under the key is 409 `idempotency.conflict`; an erased Session of the
   * same request is its 404, as the replay of its first answer would be.
   */
  private keyedEarlier(ws: string, found: SessionDoc | SessionTombstone, keyed: KeyedSession): SessionDoc | 'stale' {
    if (found.workspace_id !== ws || Date.parse(found.created_at) + keyed.keptMs <= Date.now()) return 'stale';
    if (found._keyed_fingerprint !== keyed.fingerprint) {
      throw new ApiError('idempotency.conflict', 'this Idempotency-Key was already used with a different request');
    }
    if (found.type === 'session_tombstone') throw new ApiError('validation.not_found', 'the session was deleted and its event log erased');
    return found;
  }

  /**
   * A keyed create's retry that found the Session its earlier attempt wrote: what that attempt may
   * not have done after the Session's documents (its places in the Workspace's lists, its initial
   * events and the turn they start) is done now, once; the Session is the answer.
   */
  private async resume(session: SessionDoc, initial: ReadonlyArray<{ type: string; payload: DrivePayload }>, producerKey: string | undefined, trace: Context | undefined): Promise<Record<string, unknown>> {
    await this.d.store.listed(session);
    if (initial.length > 0 && session.archived_at === null) {
      const primary = await this.d.store.thread(session.id, session._primary_thread_id);
      await this.appendInitial(session, primary, initial, producerKey, trace, true);
    }
    return this.view(session);
  }

  /**
   * A new Session's initial events: with a define, appended with the outcome and its first turn
   * in one commit; else appended in one batch, each user.message then queued for the primary
   * thread (the first starts a turn, the rest wait for theirs). `again`: a keyed create's retry,
   * whose earlier attempt may have appended and queued some (the producer key answers those
   * events): a message a Run already took is not queued again.
   */
  private async appendInitial(
    session: SessionDoc, primary: ThreadDoc, initial: ReadonlyArray<{ type: string; payload: DrivePayload }>, producerKey: string | undefined,
    trace: Context | undefined, again: boolean,
  ): Promise<void> {
    if (initial.some((e) => e.type === 'user.define_outcome') && this.d.outcomes) {
      // The initial events, the outcome and its first turn in one commit (docs/OUTCOMES.md): never
      // a define without its outcome, whatever the process meets after it.
      await this.d.outcomes.defineInNewSession(session, primary, initial, producerKey, trace);
      return;
    }
    if (initial.length === 0) return;
    const r = await this.d.store.log.append(session.id, initial.map((e) => ({ type: e.type, payload: e.payload, session_thread_id: primary.id })), { producerKey, trace });
    if (!r.ok) return;
    const taken = again ? await this.d.store.takenInputs(session.id) : new Set<string>();
    for (const ev of r.events) {
      if (ev.type === 'user.message' && !taken.has(ev.id)) await this.d.runtime.submitUserMessage(session, primary.id, ev.id, { trace });
    }
  }

  /** A `file` resource must name a File, a `memory` resource a MemoryStore, of this Workspace (404 otherwise, as for any other id). */
  async checkResources(workspaceId: string, resources: Array<{ type: string; file_id?: string; memory_store_id?: string; project_id?: string; revision_number?: number; mount_path?: string | null }>): Promise<void> {
    const { files, memory, projects } = this.d;
    resources.forEach((r, i) => checkMountPath(r.type, r.mount_path, `resources[${i}].mount_path`));
    resources.forEach((r, i) => refuseSecondMemoryStore(resources.slice(0, i), r, `resources[${i}]`));
    for (const r of resources) {
      if (projects && r.type === 'uploaded_project' && r.project_id) {
        await projects.get(workspaceId, r.project_id);
        // Pinned now: a later revision of the Project does not change what this Session mounts.
        r.revision_number ??= await projects.latestNumber(r.project_id);
        await projects.revision(r.project_id, r.revision_number);
      }
      if (files && r.type === 'file' && r.file_id) await files.get(workspaceId, r.file_id);
      if (memory && r.type === 'memory' && r.memory_store_id) await memory.getStore(workspaceId, r.memory_store_id);
    }
  }

  /** `id`: the new Resource's id (a keyed add's, derived from its key); a new one otherwise. */
  newResource(r: Record<string, unknown>, id = newId('resource')): SessionResource {
    const now = nowIso();
    const base = { id, version: 1, created_at: now, updated_at: now };
    switch (r.type) {
      case 'repository':
        return { ...base, type: 'repository', url: r.url as string, ref: (r.ref as string | null | undefined) ?? null, mount_path: (r.mount_path as string | null | undefined) ?? null };
      case 'file':
        return { ...base, type: 'file', file_id: r.file_id as string, mount_path: (r.mount_path as string | null | undefined) ?? null };
      case 'uploaded_project':
        return { ...base, type: 'uploaded_project', project_id: r.project_id as string, revision_number: r.revision_number as number, mount_path: (r.mount_path as string | null | undefined) ?? null };
      default:
        return { ...base, type: 'memory', memory_store_id: r.memory_store_id as string, access: (r.access as 'read_only' | 'read_write' | undefined) ?? 'read_only' };
    }
  }

  // ---- views ---------------------------------------------------------------------------------

  /**
   * Archive (one-way, retry-safe). Its terminal status event follows once no turn is under way
   * (now, or at the end of its last turn); the Session is written down for the scheduler's sweep
   * before the archive, so a crash in between leaves the close to the sweep. An outcome whose
   * turn waits on an answer ends `interrupted` before that event (one a crash left open is ended
   * by the sweep before it closes the Session, or by an archive sent again).
   */
  async archive(workspaceId: string, id: string): Promise<SessionDoc> {
    await this.d.store.getShared(workspaceId, id);
    await this.d.runtime.closer.archiving(id);
    const s = await this.d.store.archive(workspaceId, id);
    crashPoint('session-archived');
    await this.d.outcomes?.sessionArchived?.(s);
    await this.d.runtime.closer.settle(id);
    return s;
  }

  async view(s: SessionDoc): Promise<Record<string, unknown>> {
    const [primary, counters, metered] = await Promise.all([
      this.d.store.docs.get<ThreadDoc>(tags.session(s.id), s._primary_thread_id),
      this.d.store.log.counters(s.id),
      this.d.modelUsage?.({ session_id: s.id }) ?? Promise.resolve(null),
    ]);
    return {
      ...publicDoc(s),
      status: primary?.status ?? 'idle',
      stats: sessionStats(counters),
      usage: withMetered(usageFrom(counters, 's.'), metered),
    };
  }

  async threadView(t: ThreadDoc, counters?: Record<string, string>): Promise<Record<string, unknown>> {
    const c = counters ?? (await this.d.store.log.counters(t.session_id));
    const metered = (await this.d.modelUsage?.({ session_id: t.session_id, thread_id: t.id })) ?? null;
    const usage = withMetered(usageFrom(c, `t.${t.id}.`), metered);
    const any = Object.values(usage).some((v) => v > 0);
    const { workspace_id: ws, ...rest } = publicDoc(t);
    // A thread's snapshot is the resolved Agent without `multiagent` (the coordinator's roster is the Session's).
    const { multiagent: _roster, ...agent } = t.agent;
    return { ...rest, agent: { ...agent, workspace_id: ws }, stats: threadStats(t), usage: any ? usage : null };
  }

  // ---- list ----------------------------------------------------------------------------------

  async list(ws: string, q: {
    limit?: number | undefined; page?: string | undefined; order?: 'asc' | 'desc' | undefined; agent_id?: string | undefined;
    automation_id?: string | undefined; created_after?: string | undefined; created_before?: string | undefined; include_archived?: boolean | undefined;
  }): Promise<{ data: Record<string, unknown>[]; next_page: string | null; prev_page: string | null }> {
    const limit = q.limit ?? 20;
    const suffix = q.include_archived ? 'all' : 'live';
    const index = q.agent_id ? `sessions:agent:${q.agent_id}:${suffix}` : q.automation_id ? `sessions:automation:${q.automation_id}:${suffix}` : `sessions:${suffix}`;
    const key = keys.index(tags.workspace(ws), index);
    const min = q.created_after ? Date.parse(q.created_after) : -Infinity;
    const max = q.created_before ? Date.parse(q.created_before) : Infinity;
    const desc = (q.order ?? 'desc') === 'desc';
    const residual = q.agent_id && q.automation_id ? (s: SessionDoc) => s.automation_id === q.automation_id : null;
    const bound = listBinding(ws, q);
    const cursor = q.page ? decodePos(q.page, bound) : null;

    // A `p` cursor walks backwards from the first item of the page the client saw.
    const forward = cursor?.dir !== 'p';
    const walkDesc = forward ? desc : !desc;
    const { docs, more } = await this.scan(key, walkDesc, cursor?.pos ?? null, min, max, limit, residual);
    const page = forward ? docs : [...docs].reverse();
    const first = page[0];
    const last = page[page.length - 1];
    const pos = (s: SessionDoc): Position => ({ score: Date.parse(s.created_at), member: s.id });
    let next_page: string | null = null;
    let prev_page: string | null = null;
    if (forward) {
      if (more && last) next_page = encodePos('n', bound, pos(last));
      if (cursor && first) prev_page = (await this.scan(key, !desc, pos(first), min, max, 1, residual)).docs.length ? encodePos('p', bound, pos(first)) : null;
    } else {
      if (more && first) prev_page = encodePos('p', bound, pos(first));
      if (last) next_page = (await this.scan(key, desc, pos(last), min, max, 1, residual)).docs.length ? encodePos('n', bound, pos(last)) : null;
    }
    return { data: await Promise.all(page.map((s) => this.view(s))), next_page, prev_page };
  }

  private async scan(key: string, desc: boolean, from: Position | null, min: number, max: number, want: number, residual: ((s: SessionDoc) => boolean) | null): Promise<{ docs: SessionDoc[]; more: boolean }> {
    const out: SessionDoc[] = [];
    let pos = from;
    const chunk = Math.min(Math.max(want * 2, 50), 500);
    const fmt = (n: number) => (n === Infinity ? '+inf' : n === -Infinity ? '-inf' : String(n));
    for (;;) {
      const raw = desc
        ? await this.d.store.redis.zrevrangebyscore(key, pos ? String(Math.min(pos.score, max)) : fmt(max), fmt(min), 'WITHSCORES', 'LIMIT', 0, chunk)
        : await this.d.store.redis.zrangebyscore(key, pos ? String(Math.max(pos.score, min)) : fmt(min), fmt(max), 'WITHSCORES', 'LIMIT', 0, chunk);
      const rows: Position[] = [];
      for (let i = 0; i + 1 < raw.length; i += 2) rows.push({ member: raw[i] as string, score: Number(raw[i + 1]) });
      const p = pos;
      const fresh = p ? rows.filter((r) => r.score !== p.score || (desc ? r.member < p.member : r.member > p.member)) : rows;
      const docs = fresh.length ? await this.getMany(fresh.map((r) => r.member)) : [];
      for (let i = 0; i < fresh.length; i++) {
        const row = fresh[i] as Position;
        pos = row;
        const doc = docs[i];
        if (!doc || (residual && !residual(doc))) continue;
        if (out.length === want) return { docs: out, more: true };
        out.push(doc);
      }
      if (raw.length / 2 < chunk || (fresh.length === 0 && rows.length > 0)) return { docs: out, more: false };
    }
  }

  private async getMany(ids: string[]): Promise<(SessionDoc | null)[]> {
    // Each Session has its own hash tag (so, on a cluster, its own slot): one GET per key,
    // written together (one socket write per turn).
    const res = await getEach(this.d.store.redis, ids.map((id) => keys.doc(tags.session(id), id)));
    return res.map((v) => {
      if (typeof v !== 'string') return null;
      const doc = JSON.parse(v) as SessionDoc;
      return doc.type === 'session' ? doc : null;
    });
  }

  // ---- drive events --------------------------------------------------------------------------

  /** `trace`: the context of the request driving the Session (the parent of its appends' and its Run's spans). */
  async drive(session: SessionDoc, input: DriveInput, idemKey: string | undefined, trace?: Context): Promise<DriveOutcome> {
    const p = input.payload;
    const answering = input.type === 'user.custom_tool_result' || input.type === 'user.tool_confirmation' || input.type === 'user.question_answer';
    // Archiving stops new work, not the work under way: a turn still running can be interrupted.
    // An exact replay of an answer already recorded is no new work: it returns the original event.
    if (session.archived_at !== null && input.type !== 'user.interrupt') {
      const replay = answering ? await this.replayedAnswer(session, input) : null;
      if (replay) return replay;
      throw new ApiError('runtime.invalid_transition', 'the session is archived: it keeps its reads but takes no new work (a running turn can still be interrupted)');
    }
    if (input.type === 'user.question_answer' && (p.answers === undefined) === (p.declined === undefined)) {
      throw new ApiError('validation.malformed', 'body.payload: a user.question_answer carries exactly one of answers and declined');
    }
    if (input.type === 'user.question_answer' && p.reason !== undefined && p.declined === undefined) {
      throw new ApiError('validation.malformed', 'body.payload.reason: the reason of a decline, only with declined: true');
    }
    const threadId = p.session_thread_id ?? session._primary_thread_id;
    const queue = input.type === 'user.message';
    // A user.message needs its thread only as this process knows it without a read (read cache,
    // or as last read or written here): the append script itself refuses a missing or terminated
    // thread (one round trip, not two in a row). Other inputs read it.
    const known = queue ? this.d.store.peekThread(session.id, threadId) : undefined;
    // The checks are independent reads: made at once, reported in a fixed order (the author,
    // then the thread, then the budget), so a request with several faults always gets the same one.
    // (A message whose thread was not known is refused for its thread by the append, after the budget.)
    const [author, read, admitted] = await Promise.allSettled([
      this.d.identity.activePrincipal(session.workspace_id, p.authored_by, 'authored_by'),
      answering ? Promise.resolve(null) : queue ? threadKnown(known) : this.d.store.thread(session.id, threadId),
      input.type === 'user.message' || input.type === 'user.define_outcome' ? this.d.admitTurn?.(session) : Promise.resolve(),
    ]);
    if (author.status === 'rejected') throw author.reason;
    if (answering) return this.answer(session, input, trace);
    if (read.status === 'rejected') throw read.reason;
    const thread = read.value as Readonly<ThreadDoc> | undefined;
    if (thread?.status === 'terminated' && (input.type === 'user.message' || input.type === 'user.interrupt')) {
      throw new ApiError('runtime.invalid_transition', 'the thread is terminated');
    }
    if (admitted.status === 'rejected') throw admitted.reason;
    if (input.type === 'user.define_outcome' && thread?.status === 'terminated') throw new ApiError('runtime.invalid_transition', 'the thread is terminated');
    // A message into a thread that could start a turn (as last read, or not known without a
    // read) records the start's intent beside the append, not after it.
    const intent = queue ? this.d.runtime.intendStart(session, thread) : undefined;
    // The log's own guard against a retry whose first attempt was appended but never answered
    // (the API died, or the idempotency record was not written). It names the request, not only
    // its key: the key's record lives a day and the log's producer keys a week, so the same key
    // with another body after the record has gone is a new message, not the old one again.
    const producerKey = idemKey ? `drive:${sha256Hex(`${idemKey}\0${canonicalJson([input.type, threadId, input.payload])}`)}` : undefined;
    // A define: checked, appended and the thread taken in one step (a concurrent define is 409).
    if (input.type === 'user.define_outcome' && thread && this.d.outcomes) {
      const event = await this.d.outcomes.appendDefine(session, thread, p, producerKey, trace);
      await this.d.outcomes.defined(session, threadId, event, trace);
      return { status: 201, event };
    }
    // A message into a thread known to be able to start: the message and the start in one script.
    if (intent && thread) {
      const started = await this.d.runtime.startWithMessage(session, thread, {
        type: input.type, payload: input.payload, session_thread_id: threadId, ...(producerKey ? { producer_key: producerKey } : {}),
      }, intent, trace);
      if (started) return { status: 201, event: started.event };
    }
    const { event, thread: seen, queued } = await this.appendOne(session.id, input, threadId, producerKey, queue, trace);
    if (queue) crashPoint('message-queued');
    // The append script queued the message, read the thread and returned the queue: a busy thread is not written.
    if (queue) await this.d.runtime.submitUserMessage(session, threadId, event.id, { queued: true, thread: seen, ...(queued ? { queue: queued } : {}), ...(intent ? { intent } : {}), trace });
    if (input.type === 'user.interrupt') await this.d.runtime.interrupt(session, threadId, trace);
    return { status: 201, event };
  }

  /** Appends the drive event; with `queue`, the same script queues it for the thread's next turn and reads the thread. */
  private async appendOne(sessionId: string, input: DriveInput, threadId: string, producerKey: string | undefined, queue: boolean, trace: Context | undefined): Promise<{ event: LogEvent; duplicate: boolean; thread: ThreadDoc | null; queued?: string[] }> {
    const r = await this.d.store.log.append(
      sessionId,
      [{ type: input.type, payload: input.payload, session_thread_id: threadId, ...(producerKey ? { producer_key: producerKey } : {}) }],
      queue ? { enqueue: { list: inputQueueKey(sessionId, threadId), peek: keys.doc(tags.session(sessionId), threadId), refuseStatus: 'terminated' }, trace } : { trace },
    );
    if (!r.ok) {
      if (r.reason === 'erased') throw new ApiError('validation.not_found', 'the session was deleted and its event log erased');
      if (r.reason === 'refused') {
        if (r.detail === 'status') throw new ApiError('runtime.invalid_transition', 'the thread is terminated');
        throw new ApiError('validation.not_found', 'thread not found');
      }
      throw new ApiError('runtime.invalid_transition', 'the event log refused the append');
    }
    const ev = r.events[0];
    if (!ev) throw new ApiError('validation.not_found', 'the original event is no longer retained');
    return { event: ev, duplicate: r.duplicate[0] === true, thread: r.peeked ? this.d.store.rememberedThread(r.peeked) : null, ...(r.queued ? { queued: r.queued } : {}) };
  }

  /**
   * The thread an answer is for: the one it names, else the one waiting on its tool use, else the
   * one whose recorded answer is this one (`fp`: an exact retry), else one that waited on it.
   */
  private async answerThread(session: SessionDoc, p: DrivePayload, fp: string): Promise<ThreadDoc> {
    const toolUseId = p.tool_use_id as string;
    let thread: ThreadDoc;
    if (p.session_thread_id) {
      thread = await this.d.store.thread(session.id, p.session_thread_id);
    } else {
      const { ids } = await this.d.store.threadIds(session.id, -1, 1000);
      const all = (await this.d.store.threads(session.id, ids)).filter((t) => t._waits[toolUseId]);
      const pending = all.filter((t) => {
        const w = t._waits[toolUseId];
        return w && w.answered_event_id === null && w.generation === t._wait_generation;
      });
      if (pending.length > 1) throw new ApiError('validation.malformed', `body.payload.session_thread_id is required: ${pending.length} threads wait on ${toolUseId}`);
      const found = pending[0] ?? all.find((t) => t._waits[toolUseId]?.answer_fingerprint === fp) ?? all[0];
      if (!found) throw new ApiError('runtime.invalid_transition', `no thread waits on ${toolUseId} yet: a wait begins when the session.status_idle whose stop_reason.tool_use_ids names it is in the log`);
      thread = found;
    }
    return thread;
  }

  /**
   * What an answer is compared by to the one recorded: its payload without `caused_by` and without
   * `session_thread_id` (which only says where the wait is, found the same way when left out).
   */
  private answerFingerprint(input: DriveInput): string {
    const { caused_by: _c, session_thread_id: _t, ...exact } = input.payload;
    return sha256Hex(canonicalJson({ type: input.type, payload: exact }));
  }

  /** An exact replay of a recorded answer: the original event (200); null when `input` is not one. */
  private async replayedAnswer(session: SessionDoc, input: DriveInput): Promise<DriveOutcome | null> {
    const toolUseId = input.payload.tool_use_id as string;
    const fp = this.answerFingerprint(input);
    const thread = await this.answerThread(session, input.payload, fp).catch(() => null);
    const wait = thread?._waits[toolUseId];
    if (!wait || wait.answered_event_id === null || ANSWER_TYPE[wait.kind as keyof typeof ANSWER_TYPE] !== input.type) return null;
    return wait.answer_fingerprint === fp ? this.replayAnswer(session.id, wait, fp) : null;
  }

  /** `user.custom_tool_result` / `user.tool_confirmation` / `user.question_answer`: only for the exact current wait generation. */
  private async answer(session: SessionDoc, input: DriveInput, trace: Context | undefined): Promise<DriveOutcome> {
    const p = input.payload;
    const toolUseId = p.tool_use_id as string;
    const kind: WaitKind = input.type === 'user.custom_tool_result' ? 'custom_tool' : input.type === 'user.question_answer' ? 'question' : 'confirmation';
    const fp = this.answerFingerprint(input);
    const thread = await this.answerThread(session, p, fp);
    const wait = thread._waits[toolUseId];
    if (thread.status === 'terminated' && wait?.answered_event_id === null) throw new ApiError('runtime.invalid_transition', 'the thread is terminated');
    if (!wait) throw new ApiError('runtime.invalid_transition', `the thread does not wait on ${toolUseId}`);
    if (wait.kind === 'approval') {
      throw new ApiError('runtime.invalid_transition', `${toolUseId} waits for its ActionApproval (GET /v1/sessions/${session.id}/action-approvals); a drive event cannot answer it`);
    }
    if (wait.kind === 'delegation') {
      throw new ApiError('runtime.invalid_transition', `${toolUseId} is a delegation tool use: the platform answers it when its child threads are done; a drive event cannot answer it`);
    }
    if (wait.kind !== kind) throw new ApiError('runtime.invalid_transition', `${toolUseId} waits for a ${ANSWER_TYPE[wait.kind]}`);
    if (wait.answered_event_id !== null) {
      const replay = await this.replayAnswer(session.id, wait, fp);
      // The answer was recorded, but its request may have ended before the turn continued (the
      // process died, the continuation's start failed): the exact retry reports it again, and the
      // scheduler continues a turn that has not continued yet (once: its start is a
      // compare-and-swap from the waiting Run).
      await this.d.scheduler().waitsResolved(session.id, thread.id, thread._active_run_id, wait.generation);
      return replay;
    }
    if (wait.generation !== thread._wait_generation) throw new ApiError('runtime.invalid_transition', `the wait on ${toolUseId} is no longer current`);

    // The answer's event and its record on the wait in one script: an interrupt that ended the
    // wait after this answer's checks refuses both (409, nothing logged). Of the same answer sent
    // several times at once, one is written; the others find it recorded and answer as a replay
    // does (the original event, 200); another answer meanwhile is a conflict.
    const id = newEventId();
    const producerKey = `answer:${thread.id}:${toolUseId}:${wait.generation}`;
    const { thread: next, event, logged } = await this.d.store.answerWait(session.id, thread.id, toolUseId, (t) => withAnswer(t, toolUseId, id, SEQ_PLACEHOLDER, fp), { id, type: input.type, payload: input.payload, session_thread_id: thread.id, producer_key: producerKey }, trace);
    if (logged) return this.recordLoggedAnswer(session, input, thread.id, toolUseId, producerKey, fp, trace);
    if (!event) {
      const recorded = next._waits[toolUseId];
      if (!recorded || recorded.answered_event_id === null) throw new ApiError('runtime.invalid_transition', `the wait on ${toolUseId} is no longer current`);
      const replay = await this.replayAnswer(session.id, recorded, fp);
      await this.d.scheduler().waitsResolved(session.id, thread.id, next._active_run_id, recorded.generation);
      return replay;
    }
    crashPoint('answer-recorded');
    // Answered now: the scheduler continues the turn when this was the generation's last open
    // wait (`TurnScheduler.waitsResolved`); an exact retry after a death here does it again.
    await this.d.scheduler().waitsResolved(session.id, thread.id, next._active_run_id, wait.generation);
    return { status: 201, event };
  }

  /**
   * An answer an earlier version logged before recording it on the wait (and died between): its
   * event is found by its producer key (an append that writes nothing) and recorded now, as that
   * version would have.
   */
  private async recordLoggedAnswer(session: SessionDoc, input: DriveInput, threadId: string, toolUseId: string, producerKey: string, fp: string, trace: Context | undefined): Promise<DriveOutcome> {
    const { event } = await this.appendOne(session.id, input, threadId, producerKey, false, trace);
    const { caused_by: _c, ...stored } = event.payload as DrivePayload;
    if (sha256Hex(canonicalJson({ type: event.type, payload: stored })) !== fp) throw new ApiError('validation.conflict', `${toolUseId} was already answered with another result`);
    const next = await this.d.store.updateThread(session.id, threadId, (t) => withAnswer(t, toolUseId, event.id, event.seq, fp));
    await this.d.scheduler().waitsResolved(session.id, threadId, next._active_run_id, next._waits[toolUseId]?.generation ?? 0);
    return { status: 200, event };
  }

  private async replayAnswer(sessionId: string, wait: { answer_fingerprint: string | null; answered_seq?: number }, fp: string): Promise<DriveOutcome> {
    if (wait.answer_fingerprint !== fp) throw new ApiError('validation.conflict', 'this tool use was already answered with another result');
    const seq = wait.answered_seq ?? 0;
    const [event] = await this.d.store.log.range(sessionId, seq - 1, 1, seq);
    if (!event) throw new ApiError('validation.not_found', 'the original answer is no longer retained');
    return { status: 200, event };
  }
}

/**
 * The thread with its current wait on `toolUseId` answered by event `eventId` (`seq`); null when
 * it is answered already (by another attempt); 409 when the wait ended (an interrupt) or a newer
 * one began after the answer's checks.
 */
function withAnswer(t: ThreadDoc, toolUseId: string, eventId: string, seq: number, fp: string): ThreadDoc | null {
  const w = t._waits[toolUseId];
  if (!w || w.answered_event_id !== null) return null;
  if (w.generation !== t._wait_generation) throw new ApiError('runtime.invalid_transition', `the wait on ${toolUseId} is no longer current`);
  return { ...t, _waits: { ...t._waits, [toolUseId]: { ...w, answered_event_id: eventId, answered_seq: seq, answer_fingerprint: fp } } };
}

/** Usage counted on the log plus what the model gateway metered for the same scope. */
function withMetered(base: Usage, metered: TokenUsage | null): Usage {
  if (!metered) return base;
  return {
    input_tokens: base.input_tokens + metered.input_tokens,
    // Reasoning tokens are part of output_tokens already (docs/MODELS.md).
    output_tokens: base.output_tokens + metered.output_tokens,
    cache_read_input_tokens: base.cache_read_input_tokens + metered.cached_input_tokens,
    cache_creation_input_tokens: base.cache_creation_input_tokens + metered.cache_write_input_tokens,
  };
}

/** A thread the read cache answered for: known absent is a 404; undefined (not known) is left to the append. */
function threadKnown(t: Readonly<ThreadDoc> | null | undefined): Promise<Readonly<ThreadDoc> | undefined> {
  if (t === null) return Promise.reject(new ApiError('validation.not_found', 'thread not found'));
  return Promise.resolve(t);
}

/** The most bytes a file system takes in one name (a path segment). */
const MAX_NAME_BYTES = 255;

/**
 * Where a resource is placed in the sandbox workspace (`/workspace` or `/`, then a path): checked
 * when it is written (400), not when a Run first places it. No control character (a NUL ends the
 * name where the runner's archive and the kernel read it: `/..\0` would be `/..`), no segment
 * longer than a file system's name, no `.` or `..` segment (a path that would leave the
 * workspace), nothing under `/.agentplane` (the platform's own marker files), and a file needs a
 * path of its own, not the workspace root.
 */
export function checkMountPath(type: string, mountPath: string | null | undefined, field = 'mount_path'): void {
  if (mountPath === null || mountPath === undefined) return;
  if (/[\u0000-\u001f\u007f]/.test(mountPath)) throw new ApiError('validation.malformed', `${field}: no control characters (a NUL or a line break is no part of a path)`);
  const rel = mountPath === '/workspace' || mountPath.startsWith('/workspace/') ? mountPath.slice('/workspace'.length) : mountPath;
  const segments = rel.split('/').filter((x) => x !== '');
  if (segments.some((x) => Buffer.byteLength(x) > MAX_NAME_BYTES)) throw new ApiError('validation.malformed', `${field}: each name in the path is at most ${MAX_NAME_BYTES} bytes`);
  if (segments.some((x) => x === '.' || x === '..')) throw new ApiError('validation.malformed', `${field}: no '.' or '..' segment (the path must stay inside the workspace)`);
  if (segments[0] === '.agentplane') throw new ApiError('validation.malformed', `${field}: /.agentplane is reserved for the platform`);
  if (type === 'file' && segments.length === 0) throw new ApiError('validation.malformed', `${field}: a file needs a path of its own, not the workspace root`);
}

/**
 * A MemoryStore is one resource of a Session at most: a second would show the agent the same
 * store twice (as `memory` and `memory_2`), with two access modes. 400 naming `field`.
 */
export function refuseSecondMemoryStore(existing: ReadonlyArray<{ type: string; memory_store_id?: string }>, r: { type: string; memory_store_id?: string }, field: string): void {
  if (r.type !== 'memory' || r.memory_store_id === undefined) return;
  if (existing.some((x) => x.type === 'memory' && x.memory_store_id === r.memory_store_id)) {
    throw new ApiError('validation.malformed', `${field}: memory store ${r.memory_store_id} is already a resource of this session`);
  }
}
