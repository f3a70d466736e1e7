import type { RunRequirements } from '@agentplane/lease';
import type { ModelMessage } from '@agentplane/protocol';
import type { AgentSnapshot } from '../agents/model.js';
import type { VersionedStore } from '../versioned.js';
import type { Environment } from '../environments/model.js';
import { sandboxVersion, type SandboxProfile } from '../deployments/profiles.js';
import type { FileStore } from '../files/store.js';
import { tags, type DocumentStore, type LogEvent } from '@agentplane/store';
import type { RunDoc, SessionDoc, SessionResource } from '../sessions/model.js';
import type { SessionStore } from '../sessions/store.js';
import { conversationOf, readAll, type Responses } from './history.js';
import { checkSpecSize, fitHistory, fitResponses, SPEC_BUDGET, specBytesOf } from './spec-budget.js';
import type { GraderSpec } from '../outcomes/grader.js';
import { graderTurnSpec } from '../outcomes/spec.js';
import type { SkillReader, SpecSkill } from '../skills/model.js';
import { coordinatorToolSpecs } from '../sessions/coordinator.js';

/** A tool as the runner's harness takes it. */
export type SpecTool =
  | { type: 'builtin'; name: string; permission?: 'always_allow' | 'always_ask' }
  | { type: 'custom'; spec: { name: string; description: string; input_schema: Record<string, unknown> } };

/**
 * A Session resource as the runner materialises it. `mount_path` is workspace-relative
 * (`/` is the sandbox workspace root); absent in the Session, it defaults to the File's name or
 * the repository's name. A `file` carries its digest so the runner can tell, without
 * downloading, whether the workspace already holds it; `missing` when the File was deleted.
 */
export type SpecResource =
  | { type: 'file'; id: string; file_id: string; mount_path: string; sha256: string | null; size_bytes: number; missing?: true }
  | { type: 'repository'; id: string; url: string; ref: string | null; mount_path: string }
  /** A Project revision, fetched by the runner from `/v1/runtime/projects/{project_id}/revisions/{n}`. */
  | { type: 'uploaded_project'; id: string; project_id: string; revision_number: number; mount_path: string };

/** `https://host/org/name.git` or `git@host:org/name.git` → `name`. */
export function repositoryName(url: string): string {
  const last = url.replace(/[/:]+$/, '').split(/[/:]/).pop() ?? '';
  const name = last.replace(/\.git$/, '');
  return /^[A-Za-z0-9._-]{1,100}$/.test(name) && name !== '.' && name !== '..' ? name : 'repository';
}

/** What a turn spec reads of a Project: its name (the default mount directory). */
export interface ProjectHeads {
  get(workspaceId: string, projectId: string): Promise<{ name: string }>;
}

/** Project heads read straight from the document store (the scheduler's view; the api's ProjectService also fits). */
export class ProjectHeadReader implements ProjectHeads {
  constructor(private readonly docs: DocumentStore) {}

  async get(workspaceId: string, projectId: string): Promise<{ name: string }> {
    const doc = await this.docs.get<{ id: string; type: string; workspace_id: string; name: string; version: number; created_at: string; updated_at: string }>(tags.workspace(workspaceId), projectId);
    if (!doc || doc.type !== 'project' || doc.workspace_id !== workspaceId) throw new Error(`project ${projectId} not found`);
    return { name: doc.name };
  }
}

/** The longest name of one file a sandbox's file system holds, in UTF-8 bytes (NAME_MAX). */
const MAX_NAME_BYTES = 255;

/**
 * A File's default mount name: its filename, which may be up to 255 characters and so more than
 * the 255 bytes of UTF-8 a file system takes in one name (CJK text, say), cut to fit: the stem
 * shortened at a character boundary, an extension of up to 32 bytes kept.
 */
export function fileMountName(filename: string): string {
  if (Buffer.byteLength(filename, 'utf8') <= MAX_NAME_BYTES) return filename;
  const dot = filename.lastIndexOf('.');
  const ext = dot > 0 && Buffer.byteLength(filename.slice(dot), 'utf8') <= 32 ? filename.slice(dot) : '';
  let used = Buffer.byteLength(ext, 'utf8');
  let stem = '';
  for (const ch of filename.slice(0, filename.length - ext.length)) {
    const n = Buffer.byteLength(ch, 'utf8');
    if (used + n > MAX_NAME_BYTES) break;
    stem += ch;
    used += n;
  }
  return stem + ext;
}

/** The Session's materialisable resources (memory stores are not mounted). */
export async function specResources(resources: readonly SessionResource[], workspaceId: string, files?: FileStore, projects?: ProjectHeads): Promise<SpecResource[]> {
  const out: SpecResource[] = [];
  for (const r of resources) {
    if (r.type === 'uploaded_project' && r.project_id && r.revision_number) {
      const head = projects ? await projects.get(workspaceId, r.project_id).catch(() => null) : null;
      const name = head && /^[A-Za-z0-9._-]{1,100}$/.test(head.name) && head.name !== '.' && head.name !== '..' ? head.name : 'project';
      out.push({ type: 'uploaded_project', id: r.id, project_id: r.project_id, revision_number: r.revision_number, mount_path: r.mount_path ?? `/${name}` });
      continue;
    }
    if (r.type === 'repository' && r.url) {
      out.push({ type: 'repository', id: r.id, url: r.url, ref: r.ref ?? null, mount_path: r.mount_path ?? `/${repositoryName(r.url)}` });
    } else if (r.type === 'file' && r.file_id) {
      const head = files ? await files.get(workspaceId, r.file_id).catch(() => null) : null;
      out.push(
        head
          ? { type: 'file', id: r.id, file_id: r.file_id, mount_path: r.mount_path ?? `/${fileMountName(head.filename)}`, sha256: head.sha256, size_bytes: head.size_bytes }
          : { type: 'file', id: r.id, file_id: r.file_id, mount_path: r.mount_path ?? `/${r.file_id}`, sha256: null, size_bytes: 0, missing: true },
      );
    }
  }
  return out;
}

/**
 * Everything a runner needs to execute one turn, carried by the lease offer (`spec`). Built
 * from the Run's frozen configuration (agent version, environment version) and the thread's
 * log at offer time.
 */
export interface TurnSpec {
  run_id: string;
  session_id: string;
  thread_id: string;
  workspace_id: string;
  agent: { id: string; version: number; routing_key: string; system?: string; tools: SpecTool[] };
  environment: {
    id: string;
    version: number;
    image: string;
    resources: { cpu_millis: number; memory_mib: number; disk_mib: number; max_duration_seconds: number };
    network_mode: string;
    /** With `network_mode` `allowlist`: the hosts (`host[:port]`, `*.` for subdomains) the sandbox may reach through the runner's egress proxy. */
    allowed_hosts?: string[];
    retention_mode: string;
    /** Isolation tier the Environment requires (`container`): a runner never runs it with less. */
    tier: string;
    /** Where the runner runs the agent loop: in itself (`split`) or inside the sandbox (`colocated`). */
    harness_topology: 'split' | 'colocated';
    /** A third-party ACP agent harness instead of the built-in loop (docs/ACP.md). */
    harness?: { kind: 'acp'; package: string; command: string; args?: string[] };
    /** The Environment's opt-in browser (absent: none). */
    browser?: boolean;
  };
  resources: SpecResource[];
  /**
   * Bearer for `/v1/runtime/files/{file_id}`, `/v1/runtime/projects/…` and
   * `/v1/runtime/git-credentials` (set by the scheduler when `resources` has Files, Projects, or
   * HTTPS repositories and the Session names vaults).
   */
  runtime_files?: { bearer: string };
  history: ModelMessage[];
  responses: Responses;
  /**
   * MCP tools of the agent's servers, through `/v1/runtime/mcp/{connection_id}` with a bearer
   * that lives only as long as this lease (set by the scheduler when the agent has MCP servers).
   */
  runtime_mcp?: { bearer: string; servers: { name: string; connection_id: string; permission: 'always_allow' | 'always_ask'; path?: string }[] };
  /**
   * The Session's `memory` resources. The scheduler grants them to the lease's runtime bearer and
   * offers each to the harness as an MCP server (`memory`, `memory_2`, …) at
   * `/v1/runtime/memory/{memory_store_id}` (docs/MEMORY.md).
   */
  memory?: { memory_store_id: string; access: 'read_only' | 'read_write' }[];
  /**
   * Skills placed read-only under `.agentplane/skills/<name>/` (fetched by the runner from
   * `/v1/runtime/skills/{ref}` with `runtime_files.bearer`); the harness names each to the model
   * and opens its `SKILL.md` when asked (docs/SKILLS.md).
   */
  skills?: SpecSkill[];
  /** `outcome_grader`: a grader Run (docs/OUTCOMES.md): one model step over `grader`, no agent turn. */
  kind?: 'turn' | 'outcome_grader';
  grader?: GraderSpec & { routing_key: string };
  /**
   * The sandbox the turn runs in, when not the Session's own: each child thread of a coordinator
   * Session has its own sandbox and workspace, `<session>.<first 24 hex of the thread id>`
   * (docs/COORDINATION.md).
   */
  sandbox_id?: string;
}

/** The sandbox of a child thread: its own, named after its Session so it is released with it. */
export const childSandboxId = (sessionId: string, threadId: string): string => `${sessionId}.${threadId.replace(/^sthr_/, '').slice(0, 24)}`;

/** The Session's memory attachments (a store attached twice keeps its widest access). */
export function specMemory(resources: readonly SessionResource[]): { memory_store_id: string; access: 'read_only' | 'read_write' }[] {
  const out = new Map<string, 'read_only' | 'read_write'>();
  for (const r of resources) {
    if (r.type !== 'memory' || !r.memory_store_id) continue;
    if (out.get(r.memory_store_id) !== 'read_write') out.set(r.memory_store_id, r.access ?? 'read_only');
  }
  return [...out].map(([memory_store_id, access]) => ({ memory_store_id, access }));
}

export function specTools(agent: AgentSnapshot): SpecTool[] {
  return agent.tools.map((t): SpecTool =>
    t.type === 'builtin'
      ? { type: 'builtin', name: t.name, ...(t.permission ? { permission: t.permission } : {}) }
      : { type: 'custom', spec: { name: t.name, description: t.description, input_schema: t.input_schema } },
  );
}

/** `name` or `name@version` (a scoped name keeps its leading `@`). */
export function splitPackage(spec: string): { name: string; version?: string } {
  const at = spec.lastIndexOf('@');
  return at > 0 ? { name: spec.slice(0, at), version: spec.slice(at + 1) } : { name: spec };
}

/** The turn spec's `allowed_hosts`: an allowlist Environment's hosts, nothing for `none`. */
function allowedHostsOf(env: Environment): { allowed_hosts?: string[] } {
  return env.network.mode === 'allowlist' ? { allowed_hosts: [...env.network.allowed_hosts] } : {};
}

export function requirementsOf(env: Environment): RunRequirements {
  return {
    ...(env.harness?.kind === 'acp' ? { acp_harness: splitPackage(env.harness.package) } : {}),
    driver: env.driver,
    tier: env.tier,
    network_mode: env.network.mode,
    retention_mode: env.retention_mode,
    resources: { ...env.resources },
    ...(env.browser ? { browser: true } : {}),
  };
}

export interface SpecSources {
  store: SessionStore;
  environments: VersionedStore<Environment>;
  /** Sessions created against a deployment run in a SandboxProfile revision. */
  sandboxProfiles?: VersionedStore<SandboxProfile>;
  files?: FileStore;
  projects?: ProjectHeads;
  skills?: SkillReader;
}

/** Reads a caller made already (or started, beside its read of the Run): each is made here otherwise. */
export interface SpecPrefetch {
  session?: SessionDoc;
  /** The Session's whole event log (`readAll`). */
  events?: Promise<LogEvent[]>;
}

/**
 * A Run's turn spec, its conversation fitted to what a runner frame takes (`spec-budget.ts`);
 * throws `SpecTooLarge` when the rest of it (a huge system prompt) does not fit either.
 */
export async function buildTurnSpec(src: SpecSources, run: RunDoc, maxHistoryBytes: number = SPEC_BUDGET.historyBytes, prefetched: SpecPrefetch = {}): Promise<TurnSpec> {
  // Independent reads, all at once.
  const [s, env, events] = await Promise.all([
    prefetched.session ?? src.store.get(run.workspace_id, run.session_id),
    sandboxVersion(src, run.workspace_id, run.environment_id, run.environment_version),
    prefetched.events ?? readAll(src.store.log, run.session_id),
  ]);
  const session: SessionDoc = s;
  const isPrimary = session._primary_thread_id === run.session_thread_id;
  if (run.grader) {
    // A grader Run sees none of the thread's conversation: only its own context (docs/OUTCOMES.md).
    const grader = await graderTurnSpec(src, run, events);
    return checked({
      run_id: run.id, session_id: run.session_id, thread_id: run.session_thread_id, workspace_id: run.workspace_id,
      agent: { id: run.agent.id, version: run.agent.version, routing_key: grader.routing_key, tools: [] },
      environment: {
        id: env.id, version: env.version, image: env.image, resources: { ...env.resources }, network_mode: env.network.mode, ...allowedHostsOf(env),
        retention_mode: env.retention_mode, tier: env.tier, harness_topology: env.harness_topology ?? 'split',
      },
      resources: await specResources(session.resources, run.workspace_id, src.files),
      history: [],
      responses: { custom_tool_results: {}, confirmations: {}, question_answers: {} },
      kind: 'outcome_grader',
      grader,
    });
  }
  // Read after the log: a message in the log and still queued is a later turn's (the append and
  // the queueing are one script, and only a turn start, never during this one, takes the queue).
  const [queue, thread] = await Promise.all([
    src.store.queuedInputs(run.session_id, run.session_thread_id),
    src.store.thread(run.session_id, run.session_thread_id).catch(() => null),
  ]);
  const queued = new Set([...queue, ...(thread?._queued_inputs ?? [])]);
  const { history, responses } = conversationOf(events, run.session_thread_id, isPrimary, queued);
  // A Session's own skills (a verification's draft) take the place of an Agent's skill of the same name.
  const own = session._skills ?? [];
  const selected = src.skills ? await src.skills.resolve(run.workspace_id, run.agent.skills ?? []) : [];
  const skills = [...selected.filter((k) => !own.some((o) => o.name === k.name)), ...own];
  const delegation = isPrimary && run.agent.multiagent
    ? (await coordinatorToolSpecs(src.store, run.workspace_id, run.agent.multiagent)).map((spec): SpecTool => ({ type: 'custom', spec }))
    : [];
  const specResourceList = await specResources(session.resources, run.workspace_id, src.files, src.projects);
  const whole = (historyBytes: number): TurnSpec => ({
    run_id: run.id,
    session_id: run.session_id,
    thread_id: run.session_thread_id,
    workspace_id: run.workspace_id,
    agent: {
      id: run.agent.id,
      version: run.agent.version,
      routing_key: run.agent.model,
      ...(run.agent.system ? { system: run.agent.system } : {}),
      tools: [...specTools(run.agent), ...delegation],
    },
    environment: {
      id: env.id,
      version: env.version,
      image: env.image,
      resources: { ...env.resources },
      network_mode: env.network.mode,
      ...allowedHostsOf(env),
      retention_mode: env.retention_mode,
      tier: env.tier,
      harness_topology: run.agent_deployment?.harness_topology ?? env.harness_topology ?? 'split',
      ...(env.harness?.kind === 'acp' ? { harness: { kind: 'acp' as const, package: env.harness.package, command: env.harness.command, ...(env.harness.args ? { args: env.harness.args } : {}) } } : {}),
      ...(env.browser ? { browser: true } : {}),
    },
    resources: specResourceList,
    ...(specMemory(session.resources).length > 0 ? { memory: specMemory(session.resources) } : {}),
    ...(skills.length > 0 ? { skills } : {}),
    history: fitHistory(history, historyBytes),
    responses: fitResponses(responses),
    ...(isPrimary ? {} : { sandbox_id: childSandboxId(run.session_id, run.session_thread_id) }),
  });
  const spec = whole(maxHistoryBytes);
  // A heavy system prompt, tools and answers leave the conversation less than its budget: it
  // gives up what the rest takes beyond a frame (down to a floor), before the spec is refused.
  const size = specBytesOf(spec);
  const excess = size - SPEC_BUDGET.specBytes;
  if (excess > 0 && maxHistoryBytes - excess - 4096 >= MIN_HISTORY_BYTES) return checked(whole(maxHistoryBytes - excess - 4096));
  checkSpecSize(spec, size);
  return spec;
}

/** The least a conversation is fitted to when the rest of a spec crowds it. */
const MIN_HISTORY_BYTES = 16 * 1024;

function checked(spec: TurnSpec): TurnSpec {
  checkSpecSize(spec);
  return spec;
}
