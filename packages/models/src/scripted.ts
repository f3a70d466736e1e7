import { createHash } from 'node:crypto';
import type { ModelMessage, ModelRequest, ModelStreamEvent, TokenUsage } from '@agentplane/protocol';
import { RE2JS } from 're2js';
import type { ProviderAdapter, ProviderCall } from './adapter.js';
import { ProviderError, type ProviderErrorKind } from './errors.js';

/**
 * The `scripted` provider: a deterministic model for the embedded default and for tests.
 *
 * It reads a script from a fenced block in the system prompt (so it lives in the Agent's
 * config like any other instruction):
 *
 *     ```scripted
 *     {"rules": [
 *       {"when": {"user_contains": "weather"}, "then": [{"think": "I need the tool"}, {"tool": "get_weather", "input": {"city": "Paris"}}]},
 *       {"when": {"after_tool": "get_weather"}, "then": [{"reply": "It is {{tool_result}}."}]},
 *       {"then": [{"reply": "You said: {{user}}"}]}
 *     ]}
 *     ```
 *
 * The first rule whose `when` holds (every given condition must) runs its `then` steps in
 * order. Without a script, or when no rule matches, it echoes: `You said: <last user text>`
 * (or `Tool result: <content>` after a tool result). docs/MODELS.md has the full format.
 */
export interface ScriptCondition {
  /** What the last message is: new user text, or a tool result. */
  on?: 'user' | 'tool_result';
  /** Substring of the last user text (case-sensitive). Implies `on: "user"` unless `on` is given. */
  user_contains?: string;
  /**
   * Regular expression (RE2 syntax, matched in linear time) searched for in the last user text.
   * Scripts come from Agent configurations, so no backtracking engine ever runs them.
   */
  user_matches?: string;
  /** Substring of the last tool result's content. */
  tool_result_contains?: string;
  /** Name of the tool whose result is the last message. */
  after_tool?: string;
  /** The step number: how many assistant turns precede this request (0 for the first). */
  turn?: number;
  /**
   * Substring of the system prompt as the model receives it (what the harness added included,
   * e.g. the skills it names).
   */
  system_contains?: string;
}

export type ScriptStep =
  | { think: string }
  | { reply: string }
  | { tool: string; input?: unknown }
  /**
   * An outcome grader's answer (docs/OUTCOMES.md): replies with the verdict JSON the grader
   * parses. `criteria` items are `{criterion, verdict: "pass" | "fail", explanation?}`.
   */
  | { verdict: 'satisfied' | 'needs_revision' | 'failed'; explanation?: string; criteria?: unknown[] }
  | { sleep_ms: number }
  | { fail: Extract<ProviderErrorKind, 'rate_limited' | 'server' | 'bad_request' | 'auth'>; retry_after?: number };

export interface ScriptRule {
  when?: ScriptCondition;
  then: ScriptStep[];
}

export interface Script {
  rules: ScriptRule[];
}

const FENCE = /```scripted[^\n]*\n([\s\S]*?)```/;

/** The script carried in a system prompt, or null. A malformed script is a non-retryable error. */
export function parseScript(system: string | undefined): Script | null {
  const m = system ? FENCE.exec(system) : null;
  if (!m) return null;
  let parsed: unknown;
  try {
    parsed = JSON.parse(m[1] ?? '');
  } catch (err) {
    throw new ProviderError('bad_request', `the scripted block is not valid JSON: ${(err as Error).message}`);
  }
  const rules = Array.isArray(parsed) ? parsed : (parsed as { rules?: unknown } | null)?.rules;
  if (!Array.isArray(rules) || !rules.every((r) => r && typeof r === 'object' && Array.isArray((r as ScriptRule).then))) {
    throw new ProviderError('bad_request', 'the scripted block must be {"rules": [{"when": {...}, "then": [...]}]}');
  }
  for (const [i, r] of (rules as ScriptRule[]).entries()) {
    if (r.when !== undefined && (r.when === null || typeof r.when !== 'object' || Array.isArray(r.when))) {
      throw new ProviderError('bad_request', `scripted rule #${i + 1}: "when" must be an object`);
    }
    for (const [j, step] of r.then.entries()) {
      const why = stepProblem(step);
      if (why !== null) throw new ProviderError('bad_request', `scripted rule #${i + 1}, step #${j + 1}: ${why}`);
    }
  }
  return { rules: rules as ScriptRule[] };
}

const FAIL_KINDS: ReadonlySet<unknown> = new Set(['rate_limited', 'server', 'bad_request', 'auth']);
const VERDICTS: ReadonlySet<unknown> = new Set(['satisfied', 'needs_revision', 'failed']);
/** The longest `sleep_ms` a script may ask for (a timer's range; the step deadline ends it sooner). */
const MAX_SLEEP_MS = 2_147_483_647;

/** Why a `then` step is malformed, or null when it is one of the documented steps. */
function stepProblem(step: unknown): string | null {
  if (step === null || typeof step !== 'object' || Array.isArray(step)) return 'a step must be an object';
  const o = step as Record<string, unknown>;
  const isNum = (v: unknown) => typeof v === 'number' && Number.isFinite(v) && v >= 0;
  if ('sleep_ms' in o) return isNum(o.sleep_ms) && (o.sleep_ms as number) <= MAX_SLEEP_MS ? null : `sleep_ms must be a number of milliseconds from 0 to ${MAX_SLEEP_MS}`;
  if ('fail' in o) {
    if (!FAIL_KINDS.has(o.fail)) return 'fail must be "rate_limited", "server", "bad_request" or "auth"';
    return o.retry_after === undefined || isNum(o.retry_after) ? null : 'retry_after must be a number of seconds';
  }
  if ('think' in o) return typeof o.think === 'string' ? null : 'think must be a string';
  if ('reply' in o) return typeof o.reply === 'string' ? null : 'reply must be a string';
  if ('verdict' in o) {
    if (!VERDICTS.has(o.verdict)) return 'verdict must be "satisfied", "needs_revision" or "failed"';
    if (o.explanation !== undefined && typeof o.explanation !== 'string') return 'explanation must be a string';
    return o.criteria === undefined || Array.isArray(o.criteria) ? null : 'criteria must be an array';
  }
  if ('tool' in o) return typeof o.tool === 'string' && o.tool !== '' ? null : 'tool must be a tool name';
  return 'unknown step (expected think, reply, tool, verdict, sleep_ms or fail)';
}

interface Situation {
  on: 'user' | 'tool_result';
  user: string;
  toolResult: string;
  /** Every tool result of the last message, in order. */
  toolResults: string[];
  toolName: string | null;
  turn: number;
}

function situation(messages: ModelMessage[]): Situation {
  let user = '';
  for (let i = messages.length - 1; i >= 0 && user === ''; i--) {
    const m = messages[i] as ModelMessage;
    if (m.role === 'user') user = m.content.filter((b) => b.type === 'text').map((b) => b.text).join('\n');
  }
  const last = messages[messages.length - 1];
  const result = last?.role === 'user' ? [...last.content].reverse().find((b) => b.type === 'tool_result') : undefined;
  let toolName: string | null = null;
  if (result && result.type === 'tool_result') {
    for (const m of messages) for (const b of m.content) if (b.type === 'tool_use' && b.id === result.tool_use_id) toolName = b.name;
  }
  const lastHasText = last?.content.some((b) => b.type === 'text') ?? false;
  const results = last?.role === 'user' ? last.content.flatMap((b) => (b.type === 'tool_result' ? [b.content] : [])) : [];
  return {
    on: result && !lastHasText ? 'tool_result' : 'user',
    user,
    toolResult: result && result.type === 'tool_result' ? result.content : '',
    toolResults: results,
    toolName,
    turn: messages.filter((m) => m.role === 'assistant').length,
  };
}

const userPatterns = new Map<string, RE2JS>();

/** A `user_matches` expression compiled by RE2JS (cached); a malformed one is a bad request. */
function userPattern(source: string): RE2JS {
  let re = userPatterns.get(source);
  if (!re) {
    if (typeof source !== 'string') throw new ProviderError('bad_request', 'user_matches must be a string');
    try {
      re = RE2JS.compile(source);
    } catch (err) {
      throw new ProviderError('bad_request', `user_matches is not a valid regular expression: ${(err as Error).message}`);
    }
    if (userPatterns.size >= 256) userPatterns.delete(userPatterns.keys().next().value!);
    userPatterns.set(source, re);
  }
  return re;
}

function matches(when: ScriptCondition | undefined, s: Situation, system: string): boolean {
  if (!when) return true;
  if (when.system_contains !== undefined && !system.includes(when.system_contains)) return false;
  if (when.on !== undefined && when.on !== s.on) return false;
  // Conditions on the user's text answer new user text unless `on: "tool_result"` says otherwise.
  if (when.on === undefined && (when.user_contains !== undefined || when.user_matches !== undefined) && s.on !== 'user') return false;
  if (when.user_contains !== undefined && !s.user.includes(when.user_contains)) return false;
  if (when.user_matches !== undefined && !userPattern(when.user_matches).test(s.user)) return false;
  if (when.tool_result_contains !== undefined && (s.on !== 'tool_result' || !s.toolResult.includes(when.tool_result_contains))) return false;
  if (when.after_tool !== undefined && (s.on !== 'tool_result' || s.toolName !== when.after_tool)) return false;
  if (when.turn !== undefined && when.turn !== s.turn) return false;
  return true;
}

function fill(template: string, s: Situation): string {
  return template.replaceAll('{{user}}', s.user).replaceAll('{{tool_results}}', s.toolResults.join('\n')).replaceAll('{{tool_result}}', s.toolResult);
}

const EACH_RESULT = /^\{\{each_tool_result\.([A-Za-z0-9_]+)\}\}$/;

/** `field` of every tool result of the last message that is a JSON object carrying it. */
function eachResultField(s: Situation, field: string): unknown[] {
  const out: unknown[] = [];
  for (const r of s.toolResults) {
    try {
      const v = JSON.parse(r) as unknown;
      if (v && typeof v === 'object' && field in v) out.push((v as Record<string, unknown>)[field]);
    } catch {
      // not JSON: skipped
    }
  }
  return out;
}

function fillValue(v: unknown, s: Situation): unknown {
  if (typeof v === 'string') {
    const each = EACH_RESULT.exec(v);
    return each?.[1] ? eachResultField(s, each[1]) : fill(v, s);
  }
  if (Array.isArray(v)) return v.map((x) => fillValue(x, s));
  if (v && typeof v === 'object') return Object.fromEntries(Object.entries(v).map(([k, x]) => [k, fillValue(x, s)]));
  return v;
}

/** Words with their trailing whitespace: the text arrives in several deltas, as from a real model. */
export function splitDeltas(text: string): string[] {
  return text.match(/\S+\s*|\s+/g) ?? [];
}

/** Deterministic token estimate: one token per 4 characters, rounded up. */
export const estimateTokens = (text: string): number => Math.ceil(text.length / 4);

/**
 * The tokens one image is estimated at: what the providers charge for the largest image they
 * take in without scaling it down (Anthropic about 1,600 for 1.15 megapixels; OpenAI's tiles
 * less), whatever its encoded size.
 */
export const IMAGE_TOKENS = 1600;

/**
 * Deterministic estimate of a request's input tokens: its text (system, messages, tools) at one
 * token per 4 characters, and each image at `IMAGE_TOKENS` (its base64 bytes are not text the
 * model reads).
 */
export function estimateRequestTokens(request: ModelRequest): number {
  let images = 0;
  const messages = JSON.stringify(request.messages, function (this: unknown, key, value: unknown) {
    if (key === 'images' && Array.isArray(value) && (this as { type?: unknown }).type === 'tool_result') {
      images += value.length;
      return undefined;
    }
    return value;
  });
  return estimateTokens((request.system ?? '') + messages + (request.tools.length ? JSON.stringify(request.tools) : '')) + images * IMAGE_TOKENS;
}

function sleep(ms: number, signal: AbortSignal): Promise<void> {
  return new Promise((resolve, reject) => {
    if (signal.aborted) return reject(new ProviderError('canceled', 'the model step was canceled'));
    const t = setTimeout(() => {
      signal.removeEventListener('abort', onAbort);
      resolve();
    }, ms);
    const onAbort = () => {
      clearTimeout(t);
      reject(new ProviderError('canceled', 'the model step was canceled'));
    };
    signal.addEventListener('abort', onAbort, { once: true });
  });
}

export const SCRIPTED_DEFAULT_MODEL = 'scripted-1';

export class ScriptedAdapter implements ProviderAdapter {
  readonly provider = 'scripted';

  async *stream(call: ProviderCall, signal: AbortSignal): AsyncGenerator<ModelStreamEvent> {
    const { request } = call;
    const script = parseScript(request.system);
    const s = situation(request.messages);
    const rule = script?.rules.find((r) => matches(r.when, s, request.system ?? ''));
    const steps: ScriptStep[] = rule?.then ?? [{ reply: s.on === 'tool_result' ? 'Tool result: {{tool_result}}' : 'You said: {{user}}' }];
    let text = '';
    let thinking = '';
    let toolCalls = 0;
    let emitted = false;
    // The step's deadline bounds a scripted call as it bounds a provider's.
    const deadlineAt = call.deadlineMs === undefined ? Infinity : performance.now() + Math.max(1, call.deadlineMs);
    for (const step of steps) {
      if (signal.aborted) throw new ProviderError('canceled', 'the model step was canceled');
      if ('sleep_ms' in step) {
        const left = deadlineAt - performance.now();
        if (step.sleep_ms >= left) {
          await sleep(Math.max(0, left), signal);
          throw new ProviderError('timeout', `scripted did not finish within the step deadline of ${call.deadlineMs} ms`);
        }
        await sleep(step.sleep_ms, signal);
      } else if ('fail' in step) {
        if (emitted) throw new ProviderError('server', 'scripted failure after output');
        throw new ProviderError(step.fail, `scripted ${step.fail} failure`, { status: step.fail === 'rate_limited' ? 429 : null, retryAfterSeconds: step.retry_after ?? null });
      } else if ('think' in step) {
        const t = fill(step.think, s);
        thinking += t;
        for (const d of splitDeltas(t)) yield { type: 'thinking_delta', text: d };
        emitted = true;
      } else if ('reply' in step || 'verdict' in step) {
        const t = 'reply' in step
          ? fill(step.reply, s)
          : JSON.stringify({ result: step.verdict, ...(step.explanation !== undefined ? { explanation: fill(step.explanation, s) } : {}), ...(step.criteria ? { criteria: step.criteria } : {}) });
        text += t;
        for (const d of splitDeltas(t)) yield { type: 'text_delta', text: d };
        emitted = true;
      } else if ('tool' in step) {
        const input = fillValue(step.input ?? {}, s);
        const id = `toolu_${createHash('sha256').update(`${request.messages.length}:${toolCalls}:${step.tool}:${JSON.stringify(input)}`).digest('hex').slice(0, 32)}`;
        toolCalls += 1;
        text += JSON.stringify(input) + step.tool;
        yield { type: 'tool_use', id, name: step.tool, input };
        emitted = true;
      }
    }
    const input = estimateRequestTokens(request);
    const reasoning = estimateTokens(thinking);
    const output = estimateTokens(text) + reasoning;
    const usage: TokenUsage = {
      input_tokens: input,
      cached_input_tokens: 0,
      cache_write_input_tokens: 0,
      output_tokens: output,
      reasoning_output_tokens: reasoning,
      total_tokens: input + output,
    };
    yield { type: 'end', stop_reason: toolCalls > 0 ? 'tool_use' : 'end_turn', usage, provider: this.provider, model: call.model || SCRIPTED_DEFAULT_MODEL };
  }

  async probe(): Promise<void> {
    // Always healthy: it runs in-process.
  }
}
