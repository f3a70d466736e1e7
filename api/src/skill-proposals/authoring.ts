import type { ModelRequest } from '@agentplane/protocol';
import type { EventLog, LogEvent } from '@agentplane/store';
import { SKILL_LIMITS } from '@agentplane/domain';
import type { SkillProposalDoc } from './model.js';

/** All source transcripts together, as rendered for the author: past this the proposal fails `input_sessions_too_large`. */
export const TRANSCRIPT_LIMIT_CHARS = 256 * 1024;
/** One tool input or result in a transcript (the rest is elided). */
const TOOL_TEXT_CHARS = 2048;
const AUTHOR_MAX_OUTPUT_TOKENS = 8192;

const clip = (s: string, n: number) => (s.length > n ? `${s.slice(0, n)} […${s.length - n} more characters]` : s);

function textOf(content: unknown): string {
  if (typeof content === 'string') return content;
  if (Array.isArray(content)) {
    return content.map((b) => (b && typeof b === 'object' && typeof (b as { text?: unknown }).text === 'string' ? (b as { text: string }).text : '')).filter(Boolean).join('\n');
  }
  return '';
}

/** One event's line of a transcript, or null for an event the author does not read. */
function transcriptLine(e: LogEvent): string | null {
  const p = (e.payload ?? {}) as Record<string, unknown>;
  if (e.type === 'user.message') return `[user] ${textOf(p.content)}`;
  if (e.type === 'user.define_outcome') return `[user outcome] ${String(p.description ?? '')}`;
  if (e.type === 'agent.message') return `[agent] ${textOf(p.content)}`;
  if (e.type === 'agent.tool_use') return `[tool call ${String(p.name ?? '')}] ${clip(JSON.stringify(p.input ?? null), TOOL_TEXT_CHARS)}`;
  if (e.type === 'agent.tool_result') return `[tool result${p.is_error === true ? ' (error)' : ''}] ${clip(textOf(p.content), TOOL_TEXT_CHARS)}`;
  return null;
}

/**
 * One source Session as the author reads it: what the user asked, what the agent said, which
 * tools it used with what and what came back (clipped). Thinking, status events and
 * everything else stay out.
 */
export function renderTranscript(sessionId: string, events: readonly LogEvent[]): string {
  const lines = [`<session id="${sessionId}">`];
  for (const e of events) {
    const line = transcriptLine(e);
    if (line !== null) lines.push(line);
  }
  lines.push('</session>');
  return lines.join('\n');
}

/** Events read from a source log at a time while its transcript is rendered. */
const TRANSCRIPT_PAGE_EVENTS = 100;

/**
 * A source Session's transcript (`renderTranscript`) read a page of events at a time, or null as
 * soon as it passes `budget` characters: a long log is never held whole, only one page and at
 * most `budget` characters of transcript.
 */
export async function readTranscript(log: Pick<EventLog, 'range'>, sessionId: string, budget: number): Promise<string | null> {
  const lines = [`<session id="${sessionId}">`];
  const end = '</session>';
  let size = (lines[0] as string).length + 1 + end.length;
  if (size > budget) return null;
  for (let after = 0; ;) {
    const page = await log.range(sessionId, after, TRANSCRIPT_PAGE_EVENTS);
    for (const e of page) {
      const line = transcriptLine(e);
      if (line === null) continue;
      size += line.length + 1;
      if (size > budget) return null;
      lines.push(line);
    }
    if (page.length < TRANSCRIPT_PAGE_EVENTS) break;
    after = (page[page.length - 1] as LogEvent).seq;
  }
  lines.push(end);
  return lines.join('\n');
}

/** The author's instructions (the system prompt): its task, its output schema, the requester's instructions. */
export function authoringSystem(p: Pick<SkillProposalDoc, 'instructions' | '_skill_name'>): string {
  return [
    'You are the skill author of an agent platform. The user message holds transcripts of agent Sessions that did one class of task.',
    'Write one Agent Skill that captures the reusable procedure they show, so that a future agent doing a task of the same class gets it right the first time.',
    'Also write a verification task (a new, self-contained task of the same class, that names everything the agent needs) and a rubric that grades the agent\'s final answer to it.',
    'Answer with exactly one JSON object and nothing else:',
    '{"name": "<skill name>", "description": "<one sentence: what the skill does and when to use it>", "instructions": "<the markdown body of SKILL.md>", "task": "<the verification task>", "rubric": "<markdown list of criteria, one per item>"}',
    'The name matches ^[a-z0-9][a-z0-9._-]{0,93}$. Never copy secrets, credentials, personal data or identifiers from the transcripts into the skill, the task or the rubric.',
    ...(p._skill_name ? [`The skill's name is fixed: ${p._skill_name}.`] : []),
    ...(p.instructions ? ['', 'Instructions from the requester:', p.instructions] : []),
  ].join('\n');
}

export function authoringRequest(p: Pick<SkillProposalDoc, 'instructions' | '_skill_name' | 'model_routing_profile_key'>, transcripts: readonly string[]): ModelRequest {
  return {
    routing_key: p.model_routing_profile_key,
    system: authoringSystem(p),
    messages: [{ role: 'user', content: [{ type: 'text', text: transcripts.join('\n\n') }] }],
    tools: [],
    max_output_tokens: AUTHOR_MAX_OUTPUT_TOKENS,
  };
}

/**
 * The authoring model step's id, under which the usage ledger records (and dedupes) its cost:
 * one per attempt of the `author` job (BullMQ's `attemptsMade` counts the attempts that ended,
 * so a retry after a failed attempt is a new step and is charged), and the same for a replay of
 * one attempt (a stalled job run again), which is charged once. The job's creation time tells a
 * job queued again later (by the sweep, once an earlier one is gone) from the first.
 */
export function authoringStepId(proposalId: string, job: { timestamp: number; attemptsMade: number }): string {
  return `skill-proposal:${proposalId}:author:${job.timestamp}:${job.attemptsMade + 1}`;
}

export interface AuthoredSkill {
  name: string | null;
  description: string;
  instructions: string;
  task: string;
  rubric: string;
}

/** The author's answer (a bare JSON object or a fenced `json` block), or null when it is not one. */
export function parseAuthoredSkill(text: string): AuthoredSkill | null {
  const fenced = /```(?:json)?\s*\n([\s\S]*?)```/.exec(text);
  const raw = (fenced?.[1] ?? text).trim();
  const start = raw.indexOf('{');
  const end = raw.lastIndexOf('}');
  if (start === -1 || end <= start) return null;
  let v: unknown;
  try {
    v = JSON.parse(raw.slice(start, end + 1));
  } catch {
    return null;
  }
  const o = v as Record<string, unknown> | null;
  if (!o || typeof o !== 'object') return null;
  const str = (k: string, max: number) => (typeof o[k] === 'string' && (o[k] as string).trim().length > 0 && (o[k] as string).length <= max ? (o[k] as string) : null);
  const description = str('description', SKILL_LIMITS.maxDescriptionChars);
  const instructions = str('instructions', 512 * 1024);
  const task = str('task', 16_384);
  const rubric = str('rubric', 65_536);
  if (!description || !instructions || !task || !rubric) return null;
  return { name: typeof o.name === 'string' ? o.name : null, description: description.replace(/\s+/g, ' ').trim(), instructions, task, rubric };
}
