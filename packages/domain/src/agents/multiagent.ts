/**
 * A coordinator Agent's `multiagent` configuration: the roster of member Agents (each pinned to
 * an exact version) its Sessions may run as child threads, and the delegation tools the
 * coordinator's model sees (docs/COORDINATION.md).
 */
import { ApiError, Obj, Type, type Static } from '@agentplane/core';
import type { ToolT } from './tools.js';

export const MULTIAGENT_LIMITS = {
  /** Members of one roster. */
  members: 16,
  /** Child threads of one Session that may run (or wait to run) at the same time. */
  maxConcurrentThreads: 32,
  /** Default of `max_concurrent_threads`. */
  defaultConcurrentThreads: 16,
  /** Child threads one Session may ever spawn. */
  threadsPerSession: 256,
  /** Characters of a task handed to a child. */
  taskChars: 100_000,
  /** Characters of a child's result handed back to the coordinator. */
  resultChars: 16_000,
} as const;

export const RosterEntry = Obj({
  agent_id: Type.String({ pattern: '^agent_[0-9a-f]{32}$' }),
  version: Type.Integer({ minimum: 1 }),
});
export const Multiagent = Obj({
  roster: Type.Array(RosterEntry, { minItems: 1, maxItems: MULTIAGENT_LIMITS.members }),
  max_concurrent_threads: Type.Optional(Type.Integer({ minimum: 1, maximum: MULTIAGENT_LIMITS.maxConcurrentThreads })),
});
export type MultiagentT = Static<typeof Multiagent>;

/** The delegation tools: platform tools of the primary thread of a coordinator Session. */
export const DELEGATION_TOOLS = ['start_thread', 'wait_threads', 'read_thread', 'stop_thread'] as const;
export type DelegationTool = (typeof DELEGATION_TOOLS)[number];

export const isDelegationTool = (name: string): name is DelegationTool => (DELEGATION_TOOLS as readonly string[]).includes(name);

/** A roster member as the coordinator's model names it (its Agent name, or its id when names repeat). */
export interface RosterMember {
  agent_id: string;
  version: number;
  name: string;
}

/** The tool specs the coordinator's model sees (custom tools answered by the control plane). */
export function delegationToolSpecs(members: readonly RosterMember[]): { name: DelegationTool; description: string; input_schema: Record<string, unknown> }[] {
  const names = members.map((m) => m.name);
  const threadIds = { type: 'array', items: { type: 'string' }, description: 'Child thread ids; omitted: every child thread of this Session' };
  return [
    {
      name: 'start_thread',
      description: `Start a child thread: a roster member works on a task in parallel with you. Returns its session_thread_id at once. Members: ${names.join(', ')}.`,
      input_schema: {
        type: 'object',
        properties: { agent: { type: 'string', enum: names, description: 'The roster member' }, task: { type: 'string', description: 'What the member should do' } },
        required: ['agent', 'task'],
      },
    },
    {
      name: 'wait_threads',
      description: 'Wait until child threads finish their turn (mode "all", the default) or until the first of them does ("any"); returns their results.',
      input_schema: { type: 'object', properties: { session_thread_ids: threadIds, mode: { type: 'string', enum: ['all', 'any'] } } },
    },
    {
      name: 'read_thread',
      description: "Read a child thread's status and latest result without waiting.",
      input_schema: { type: 'object', properties: { session_thread_id: { type: 'string' } }, required: ['session_thread_id'] },
    },
    {
      name: 'stop_thread',
      description: "Interrupt a child thread's running turn.",
      input_schema: { type: 'object', properties: { session_thread_id: { type: 'string' } }, required: ['session_thread_id'] },
    },
  ];
}

/** Names the model uses for the members: Agent names, unless two members share one. */
export function rosterMembers(entries: readonly { agent_id: string; version: number; name: string }[]): RosterMember[] {
  const counts = new Map<string, number>();
  for (const e of entries) counts.set(e.name, (counts.get(e.name) ?? 0) + 1);
  return entries.map((e) => ({ agent_id: e.agent_id, version: e.version, name: (counts.get(e.name) ?? 0) > 1 ? e.agent_id : e.name }));
}

/**
 * Checks a `multiagent` configuration against the Agent store: every member exists at its pinned
 * version in the Workspace (404 otherwise), is not itself a coordinator (depth 1) and appears once;
 * the coordinator's own tools do not use the delegation tool names.
 */
export async function checkMultiagent(
  config: MultiagentT,
  tools: readonly ToolT[],
  getVersion: (agentId: string, version: number) => Promise<{ multiagent?: MultiagentT | null | undefined }>,
  field = 'body.multiagent',
): Promise<void> {
  const seen = new Set<string>();
  for (const [i, m] of config.roster.entries()) {
    if (seen.has(m.agent_id)) throw new ApiError('validation.malformed', `${field}.roster.${i}: ${m.agent_id} is listed twice`);
    seen.add(m.agent_id);
    const member = await getVersion(m.agent_id, m.version);
    if (member.multiagent) {
      throw new ApiError('validation.malformed', `${field}.roster.${i}: ${m.agent_id} is a coordinator; child threads do not spawn children (depth 1)`);
    }
  }
  checkCoordinatorTools(tools);
}

/** A coordinator's own tools (`field`) do not use the delegation tool names (400). */
export function checkCoordinatorTools(tools: readonly ToolT[], field = 'body.tools'): void {
  for (const t of tools) {
    if (t.type === 'custom' && isDelegationTool(t.name)) throw new ApiError('validation.malformed', `${field}: '${t.name}' is reserved for the delegation tools of a coordinator`);
  }
}
