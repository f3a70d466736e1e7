/**
 * The agent loop of one Run (split topology: the loop runs in the runner, tools run in the
 * sandbox). Model step → agent.thinking / agent.message / agent.tool_use → built-in tools in the
 * sandbox → tool_results back to the model → … until the model ends the turn, then
 * `session.status_idle` with the stop reason. Custom tools and `always_ask` tools end the Run
 * with `requires_action`; the next Run resolves them from the drive events' responses.
 */
import { addUsage, ZERO_USAGE, type ContentBlock, type ModelClient, type ModelMessage, type ModelRequest, type TokenUsage, type ToolSpec } from '@agentplane/protocol';
import type { Logger } from '@agentplane/core';
import type { CommandRunner, Sandbox } from '../sandbox/types.js';
import { SandboxError } from '../sandbox/types.js';
import { InfrastructureFailure } from '../failures.js';
import { builtinTool, runTool } from './tools/builtin.js';
import { QUESTION_TOOL_NAME, questionInputError, questionToolSpec } from './tools/question.js';
import type { BuiltinTool, FileStore, ToolOutcome } from './tools/types.js';
import type { BrowserSession } from './tools/browser-session.js';
import {
  HarnessError,
  type AgentConfig,
  type HarnessEvent,
  type IdleStopReason,
  type SessionEventSink,
  type StepRecord,
  type ToolUsePayload,
} from './events.js';

/** One tool use as the control plane's ActionPolicies see it. */
export interface GateQuery {
  tool_use_id: string;
  tool: { kind: 'builtin' | 'custom' | 'mcp'; name: string; connection_id?: string };
  input: unknown;
}

export interface GateDecision {
  decision: 'allow' | 'deny' | 'require_approval';
  rule_id: string | null;
  message: string;
}

/**
 * Asks the control plane before a tool use runs (split: `tool.check` on the lease; colocated:
 * relayed by the runner). A gate that throws denies.
 */
export type ToolGate = (q: GateQuery) => Promise<GateDecision>;

export interface HarnessDeps {
  model: ModelClient;
  /** Runs the built-in tools' commands: a sandbox driver (split) or local child processes (colocated). */
  driver: CommandRunner;
  sandbox: Sandbox;
  sink: SessionEventSink;
  logger?: Logger;
  /** ActionPolicy check before each tool use; absent = no governance (unit tests). */
  gate?: ToolGate;
  /** Wraps each tool use (the runner's tracing span); absent = run as is. */
  traceTool?: ToolTracer;
  /** The Run's browser (Environments with `browser: true`); closed when the Run ends, before idle. */
  browser?: BrowserSession;
  /** Stores a File of the Session (browser screenshots). */
  storeFile?: FileStore;
}

/** Runs one tool use inside whatever the runner wraps it in (a span); `failed` marks an error result. */
export type ToolTracer = <T extends ContentBlock>(tool: { name: string; id: string }, run: () => Promise<T>, failed: (result: T) => boolean) => Promise<T>;

/** Answers to the blocking tool uses of the previous Run, from drive events. */
export interface PendingResponses {
  /** `user.custom_tool_result`: tool_use_id → result. */
  custom_tool_results?: Record<string, { content: string; is_error?: boolean }>;
  /** `user.tool_confirmation`: tool_use_id → allow | deny. */
  confirmations?: Record<string, 'allow' | 'deny'>;
  /** `user.question_answer`: tool_use_id → the answers (or the decline) as the model reads them. */
  question_answers?: Record<string, { content: string; is_error?: boolean }>;
}

export interface RunInput {
  agent: AgentConfig;
  /** The thread so far, ending with the new user message or with the previous Run's blocking tool uses. */
  history: ModelMessage[];
  responses?: PendingResponses;
  session_thread_id?: string;
  /** `user.interrupt`: stops the model step and kills running tools. */
  signal?: AbortSignal;
  /** Wall-time bound of this Run (the Environment's `max_duration_seconds`). */
  max_duration_seconds?: number;
}

export interface RunOutcome {
  stop_reason: IdleStopReason;
  /** The whole thread after this Run (the caller persists it). */
  history: ModelMessage[];
  usage: TokenUsage;
  steps: StepRecord[];
  /**
   * What answers each use a `requires_action` stop names, when the use was reported in an
   * earlier Run (a resumed use that still waits); uses reported in this Run carry it in their
   * `agent.tool_use` event.
   */
  awaiting?: Map<string, 'custom_tool_result' | 'tool_confirmation' | 'question_answer'>;
}

const DENIED = 'The user denied this tool call; it was not executed.';
const INTERRUPTED = 'Interrupted before the tool finished.';
const ABANDONED = 'Not run: the user sent a new message instead of answering this tool call.';

interface Classified {
  block: Extract<ContentBlock, { type: 'tool_use' }>;
  builtin?: BuiltinTool;
  external?: Extract<AgentConfig['tools'][number], { type: 'external' }>;
  awaiting?: ToolUsePayload['awaiting'];
  /** Refused by an ActionPolicy: answered with a refusal, never run. */
  denied?: GateDecision;
  /**
   * `require_approval`: the use waits for its ActionApproval (resolved in the control plane), so
   * it is not run in this Run whatever drive events say; a later Run's check tells allow or deny.
   */
  approval?: boolean;
  /** A question whose input is malformed: answered with this error at once. */
  invalid?: string;
}

/**
 * Largest model request that keeps its images: a request travels to the model gateway in one
 * runner frame (1 MiB), so past this the images (screenshots) are left out and the tool results
 * say so; their Files stay in the Session.
 */
export const MAX_REQUEST_BYTES_WITH_IMAGES = 900 * 1024;

export function withinFrame(request: ModelRequest): ModelRequest {
  const hasImages = request.messages.some((m) => m.content.some((b) => b.type === 'tool_result' && b.images?.length));
  if (!hasImages || Buffer.byteLength(JSON.stringify(request)) <= MAX_REQUEST_BYTES_WITH_IMAGES) return request;
  return {
    ...request,
    messages: request.messages.map((m) => ({
      role: m.role,
      content: m.content.map((b): ContentBlock => {
        if (b.type !== 'tool_result' || !b.images?.length) return b;
        const { images: _images, ...rest } = b;
        void _images;
        return { ...rest, content: `${rest.content}\n(The image is not shown: the request would be too large. Its File is kept.)` };
      }),
    })),
  };
}

export const policyRefusal = (d: GateDecision): string =>
  `Not run: refused by the workspace's ActionPolicy${d.rule_id ? ` ${d.rule_id}` : ''} (${d.message}).`;

/**
 * A model step's content as its stream arrives: text (or thinking) that runs on is one block, a
 * block of another kind between them starts a new one. The loop builds its steps with it, and the
 * colocated runner's audit the steps it relayed, so both read a step alike.
 */
export function appendStreamedText(content: ContentBlock[], type: 'text' | 'thinking', text: string): void {
  const last = content[content.length - 1];
  if (last && last.type === type) last.text += text;
  else content.push({ type, text });
}

export class HarnessLoop {
  constructor(private readonly deps: HarnessDeps) {}

  /** The tools the model sees: enabled built-ins (their schemas) and the agent's custom tools. */
  static toolSpecs(agent: AgentConfig): ToolSpec[] {
    const specs: ToolSpec[] = [];
    for (const tool of agent.tools) {
      if (tool.type === 'custom' || tool.type === 'external') specs.push(tool.spec);
      else if (tool.name === QUESTION_TOOL_NAME) specs.push(questionToolSpec);
      else {
        const builtin = builtinTool(tool.name);
        if (builtin) specs.push(builtin.spec);
      }
    }
    return specs;
  }

  private classify(agent: AgentConfig, block: Extract<ContentBlock, { type: 'tool_use' }>): Classified {
    for (const tool of agent.tools) {
      if (tool.type === 'custom' && tool.spec.name === block.name) return { block, awaiting: 'custom_tool_result' };
      if (tool.type === 'external' && tool.spec.name === block.name) {
        return { block, external: tool, awaiting: tool.permission === 'always_ask' ? 'tool_confirmation' : undefined };
      }
      if (tool.type === 'builtin' && tool.name === block.name && tool.name === QUESTION_TOOL_NAME) {
        // A malformed question is answered at once with an error result instead of waiting.
        const bad = questionInputError(block.input);
        return bad ? { block, invalid: `invalid input for ${QUESTION_TOOL_NAME}: ${bad}` } : { block, awaiting: 'question_answer' };
      }
      if (tool.type === 'builtin' && tool.name === block.name) {
        const builtin = builtinTool(tool.name);
        if (!builtin) break;
        return { block, builtin, awaiting: tool.permission === 'always_ask' ? 'tool_confirmation' : undefined };
      }
    }
    return { block };
  }

  /**
   * The control plane's say on one tool use: a deny answers it with a refusal; a
   * require_approval makes it blocking until its ActionApproval is resolved (a tool the runner
   * runs reports `awaiting: tool_confirmation`, a custom tool keeps `custom_tool_result`).
   * Custom tools are asked too (a deny refuses them before the client is asked).
   */
  private async governed(c: Classified): Promise<Classified> {
    const gate = this.deps.gate;
    if (!gate) return c;
    const tool: GateQuery['tool'] = c.external?.mcp
      ? { kind: 'mcp', name: c.external.mcp.tool, connection_id: c.external.mcp.connection_id }
      : { kind: c.builtin ? 'builtin' : c.awaiting === 'custom_tool_result' ? 'custom' : c.external ? 'custom' : 'builtin', name: c.block.name };
    let d: GateDecision;
    try {
      d = await gate({ tool_use_id: c.block.id, tool, input: c.block.input });
    } catch (err) {
      d = { decision: 'deny', rule_id: null, message: `the policy check failed (${err instanceof Error ? err.message : String(err)}); denied (fail closed)` };
    }
    if (d.decision === 'deny') return { block: c.block, denied: d };
    // require_approval: the use waits for its ActionApproval first; a custom tool or a question
    // then still waits for its own answer, any other tool for nothing more.
    if (d.decision === 'require_approval') {
      return { ...c, approval: true, awaiting: c.awaiting === 'custom_tool_result' || c.awaiting === 'question_answer' ? c.awaiting : 'tool_confirmation' };
    }
    return c;
  }

  private async refuse(c: Classified, emit: (e: HarnessEvent) => Promise<void>): Promise<ContentBlock> {
    const content = policyRefusal(c.denied as GateDecision);
    await emit({ type: 'agent.tool_result', payload: { tool_use_id: c.block.id, content, is_error: true, denied: true, ...(c.denied?.rule_id ? { policy_rule_id: c.denied.rule_id } : {}) } });
    return { type: 'tool_result', tool_use_id: c.block.id, content, is_error: true };
  }

  async run(input: RunInput): Promise<RunOutcome> {
    const { sink } = this.deps;
    const history = input.history.map((m) => ({ role: m.role, content: [...m.content] }));
    this.closeAbandoned(history);
    const steps: StepRecord[] = [];
    let usage: TokenUsage = { ...ZERO_USAGE };
    const thread = input.session_thread_id;
    const emit = (event: HarnessEvent): Promise<void> => sink.emit(thread ? { ...event, session_thread_id: thread } : event);

    const deadline = new AbortController();
    const timer = input.max_duration_seconds ? setTimeout(() => deadline.abort(), input.max_duration_seconds * 1000) : undefined;
    const signal = AbortSignal.any([deadline.signal, ...(input.signal ? [input.signal] : [])]);
    const runEnds = input.max_duration_seconds ? Date.now() + input.max_duration_seconds * 1000 : undefined;
    const stopped = (): IdleStopReason | undefined =>
      input.signal?.aborted ? { type: 'interrupted' } : deadline.signal.aborted ? { type: 'max_duration' } : undefined;
    const idle = async (stop_reason: IdleStopReason): Promise<RunOutcome> => {
      // The Run's browser ends with the Run, before the Session is reported idle.
      await this.deps.browser?.close();
      await emit({ type: 'session.status_idle', payload: { stop_reason, usage } });
      return { stop_reason, history, usage, steps };
    };

    try {
      // 1. Resolve the previous Run's blocking tool uses, if the thread ends with them.
      const waiting = this.unresolved(history);
      if (waiting.length > 0) {
        const responses = input.responses ?? {};
        const governed: Classified[] = [];
        // Every waiting use is asked again: a rule added meanwhile applies, and an ActionApproval
        // resolved meanwhile is read (approved: allow; denied or expired: deny).
        for (const b of waiting) governed.push(await this.governed(this.classify(input.agent, b)));
        const byId = new Map(governed.map((c) => [c.block.id, c]));
        const unanswered = governed.filter((c) => !c.denied && (c.approval
          || (c.awaiting === 'custom_tool_result' && !responses.custom_tool_results?.[c.block.id])
          || (c.awaiting === 'tool_confirmation' && !responses.confirmations?.[c.block.id])
          || (c.awaiting === 'question_answer' && !responses.question_answers?.[c.block.id])));
        if (unanswered.length > 0) {
          const out = await idle({ type: 'requires_action', tool_use_ids: unanswered.map((c) => c.block.id) });
          return { ...out, awaiting: new Map(unanswered.map((c) => [c.block.id, c.awaiting === 'custom_tool_result' || c.awaiting === 'question_answer' ? c.awaiting : 'tool_confirmation'])) };
        }
        const results: ContentBlock[] = [];
        for (const block of waiting) {
          const c = byId.get(block.id) as Classified;
          if (c.denied) {
            results.push(await this.refuse(c, emit));
            continue;
          }
          if (signal.aborted) {
            results.push({ type: 'tool_result', tool_use_id: block.id, content: INTERRUPTED, is_error: true });
            continue;
          }
          if (c.awaiting === 'question_answer') {
            const r = responses.question_answers?.[block.id];
            await emit({ type: 'agent.tool_result', payload: { tool_use_id: block.id, content: r?.content ?? '', is_error: r?.is_error ?? false } });
            results.push({ type: 'tool_result', tool_use_id: block.id, content: r?.content ?? '', ...(r?.is_error ? { is_error: true } : {}) });
          } else if (c.awaiting === 'custom_tool_result') {
            const r = responses.custom_tool_results?.[block.id];
            results.push({ type: 'tool_result', tool_use_id: block.id, content: r?.content ?? '', ...(r?.is_error ? { is_error: true } : {}) });
          } else if (c.awaiting === 'tool_confirmation' && responses.confirmations?.[block.id] === 'deny') {
            await emit({ type: 'agent.tool_result', payload: { tool_use_id: block.id, content: DENIED, is_error: true, denied: true } });
            results.push({ type: 'tool_result', tool_use_id: block.id, content: DENIED, is_error: true });
          } else {
            results.push(await this.execute(c, signal, runEnds, emit));
          }
        }
        this.appendResults(history, results);
      }

      // 2. Model steps until the turn ends.
      const maxSteps = input.agent.max_steps ?? 100;
      const tools = HarnessLoop.toolSpecs(input.agent);
      for (let index = 0; ; index++) {
        const early = stopped();
        if (early) return await idle(early);
        if (index >= maxSteps) return await idle({ type: 'max_steps' });

        const request: ModelRequest = {
          routing_key: input.agent.routing_key,
          messages: history,
          tools,
          ...(input.agent.system !== undefined ? { system: input.agent.system } : {}),
          ...(input.agent.max_output_tokens !== undefined ? { max_output_tokens: input.agent.max_output_tokens } : {}),
          ...(input.agent.temperature !== undefined ? { temperature: input.agent.temperature } : {}),
        };
        const step = await this.modelStep(withinFrame(request), signal, index);
        if (!step) return await idle(stopped() ?? { type: 'interrupted' });
        steps.push(step.record);
        usage = addUsage(usage, step.record.usage);
        sink.step?.(step.record);
        history.push({ role: 'assistant', content: step.content });

        const thinking = step.content.filter((b): b is { type: 'thinking'; text: string } => b.type === 'thinking');
        if (thinking.length > 0) await emit({ type: 'agent.thinking', payload: { content: thinking } });
        const text = step.content.filter((b): b is { type: 'text'; text: string } => b.type === 'text');
        if (text.length > 0) await emit({ type: 'agent.message', payload: { content: text } });

        const uses = step.content.filter((b): b is Extract<ContentBlock, { type: 'tool_use' }> => b.type === 'tool_use');
        const classified: Classified[] = [];
        for (const b of uses) classified.push(await this.governed(this.classify(input.agent, b)));
        for (const c of classified) {
          await emit({
            type: 'agent.tool_use',
            payload: { id: c.block.id, name: c.block.name, input: c.block.input, blocking: c.awaiting !== undefined, ...(c.awaiting ? { awaiting: c.awaiting } : {}) },
          });
        }
        if (uses.length === 0) {
          const reason = step.record.stop_reason;
          if (reason === 'max_tokens') return await idle({ type: 'max_tokens' });
          if (reason === 'refusal') return await idle({ type: 'refusal' });
          if (reason === 'canceled') return await idle(stopped() ?? { type: 'interrupted' });
          return await idle({ type: 'end_turn' });
        }

        const results: ContentBlock[] = [];
        for (const c of classified) {
          if (c.awaiting) continue;
          if (c.denied) {
            results.push(await this.refuse(c, emit));
            continue;
          }
          if (c.invalid !== undefined) {
            await emit({ type: 'agent.tool_result', payload: { tool_use_id: c.block.id, content: c.invalid, is_error: true } });
            results.push({ type: 'tool_result', tool_use_id: c.block.id, content: c.invalid, is_error: true });
            continue;
          }
          if (signal.aborted) {
            results.push({ type: 'tool_result', tool_use_id: c.block.id, content: INTERRUPTED, is_error: true });
            continue;
          }
          results.push(await this.execute(c, signal, runEnds, emit));
        }
        const blocking = classified.filter((c) => c.awaiting);
        if (results.length > 0) this.appendResults(history, results);
        if (blocking.length > 0) {
          if (stopped()) {
            // Interrupted: blocking uses are answered as not run, so the thread stays well formed.
            this.appendResults(history, blocking.map((c) => ({ type: 'tool_result', tool_use_id: c.block.id, content: INTERRUPTED, is_error: true })));
            return await idle(stopped()!);
          }
          return await idle({ type: 'requires_action', tool_use_ids: blocking.map((c) => c.block.id) });
        }
      }
    } finally {
      if (timer) clearTimeout(timer);
    }
  }

  /**
   * A new user message arrived while tool uses still waited for an answer: those uses are
   * answered as abandoned, ahead of the message, so the thread stays well formed for the model.
   */
  private closeAbandoned(history: ModelMessage[]): void {
    const last = history[history.length - 1];
    if (!last || last.role !== 'user' || last.content.every((b) => b.type === 'tool_result')) return;
    let i = history.length - 2;
    const results = history[i];
    const hasResults = results !== undefined && results.role === 'user' && results.content.every((b) => b.type === 'tool_result');
    if (hasResults) i -= 1;
    const assistant = history[i];
    if (!assistant || assistant.role !== 'assistant') return;
    const answered = new Set([...(hasResults ? results.content : []), ...last.content].flatMap((b) => (b.type === 'tool_result' ? [b.tool_use_id] : [])));
    const abandoned = assistant.content.flatMap((b): ContentBlock[] =>
      b.type === 'tool_use' && !answered.has(b.id) ? [{ type: 'tool_result', tool_use_id: b.id, content: ABANDONED, is_error: true }] : [],
    );
    if (hasResults) {
      // One user turn after the tool uses: the earlier results, the abandoned ones, then the message.
      (results.content as ContentBlock[]).push(...abandoned, ...last.content);
      history.pop();
    } else {
      last.content.unshift(...abandoned);
    }
  }

  /** Tool uses of the last assistant message that have no tool_result yet. */
  private unresolved(history: ModelMessage[]): Array<Extract<ContentBlock, { type: 'tool_use' }>> {
    let i = history.length - 1;
    if (i >= 0 && history[i]!.role === 'user') {
      // A trailing user message counts only when it carries tool results (partial answers).
      if (!history[i]!.content.every((b) => b.type === 'tool_result')) return [];
      i -= 1;
    }
    const assistant = history[i];
    if (!assistant || assistant.role !== 'assistant') return [];
    const answered = new Set(history.slice(i + 1).flatMap((m) => m.content.flatMap((b) => (b.type === 'tool_result' ? [b.tool_use_id] : []))));
    return assistant.content.filter((b): b is Extract<ContentBlock, { type: 'tool_use' }> => b.type === 'tool_use' && !answered.has(b.id));
  }

  /**
   * Adds tool results to the trailing user message of results, or starts one. Images (browser
   * screenshots) stay only on the newest results: the model request travels in one runner frame.
   */
  private appendResults(history: ModelMessage[], results: ContentBlock[]): void {
    if (results.some((b) => b.type === 'tool_result' && b.images?.length)) {
      for (const m of history) {
        for (let i = 0; i < m.content.length; i++) {
          const b = m.content[i] as ContentBlock;
          if (b.type === 'tool_result' && b.images) {
            const { images: _dropped, ...rest } = b;
            void _dropped;
            (m.content as ContentBlock[])[i] = rest;
          }
        }
      }
    }
    const last = history[history.length - 1];
    if (last && last.role === 'user' && last.content.every((b) => b.type === 'tool_result')) (last.content as ContentBlock[]).push(...results);
    else history.push({ role: 'user', content: results });
  }

  /** One tool use, wrapped by `traceTool` when the runner traces. */
  private execute(c: Classified, signal: AbortSignal, runEnds: number | undefined, emit: (e: HarnessEvent) => Promise<void>): Promise<ContentBlock> {
    const run = () => this.executeTool(c, signal, runEnds, emit);
    return this.deps.traceTool ? this.deps.traceTool({ name: c.block.name, id: c.block.id }, run, (b) => b.type === 'tool_result' && b.is_error === true) : run();
  }

  private async executeTool(c: Classified, signal: AbortSignal, runEnds: number | undefined, emit: (e: HarnessEvent) => Promise<void>): Promise<ContentBlock> {
    let outcome: ToolOutcome;
    if (c.external) {
      const started = Date.now();
      try {
        outcome = { ...(await c.external.call(c.block.input, signal, c.block.id)), meta: { durationMs: Date.now() - started } };
      } catch (err) {
        outcome = { content: `tool ${c.block.name} failed: ${err instanceof Error ? err.message : String(err)}`, is_error: true };
      }
    } else if (!c.builtin) {
      outcome = { content: `Unknown tool '${c.block.name}'.`, is_error: true };
    } else {
      try {
        outcome = await runTool(c.builtin, {
          driver: this.deps.driver,
          sandbox: this.deps.sandbox,
          signal,
          ...(runEnds !== undefined ? { maxTimeoutMs: Math.max(1, runEnds - Date.now()) } : {}),
          toolUseId: c.block.id,
          ...(this.deps.browser ? { browser: this.deps.browser } : {}),
          ...(this.deps.storeFile ? { storeFile: this.deps.storeFile } : {}),
        }, c.block.input);
      } catch (err) {
        if (err instanceof SandboxError) {
          throw new HarnessError('sandbox_error', `tool ${c.block.name} could not run: ${err.message}`, undefined, { cause: err });
        }
        throw err;
      }
    }
    // Killed because the runner stops (a second signal, the drain deadline): not the tool's outcome.
    // Nothing is recorded for it, so the Run's retry runs the tool again (as after a crash).
    if (signal.aborted && signal.reason instanceof InfrastructureFailure) throw signal.reason;
    const m = outcome.meta;
    await emit({
      type: 'agent.tool_result',
      payload: {
        tool_use_id: c.block.id,
        content: outcome.content,
        is_error: outcome.is_error,
        ...(m?.exitCode !== undefined ? { exit_code: m.exitCode } : {}),
        ...(m?.timedOut ? { timed_out: true } : {}),
        ...(m?.oomKilled ? { oom_killed: true } : {}),
        ...(m?.killed ? { interrupted: true } : {}),
        ...(m?.durationMs !== undefined ? { duration_ms: m.durationMs } : {}),
        // A screenshot is named by its File; its bytes go to the model only, never to the log.
        ...(m?.fileId !== undefined ? { file_id: m.fileId } : {}),
      },
    });
    return {
      type: 'tool_result', tool_use_id: c.block.id, content: outcome.content,
      ...(outcome.is_error ? { is_error: true } : {}),
      ...(outcome.images?.length ? { images: outcome.images } : {}),
    };
  }

  /** One model step; undefined when the signal stopped it. Model errors throw HarnessError. */
  private async modelStep(request: ModelRequest, signal: AbortSignal, index: number): Promise<{ content: ContentBlock[]; record: StepRecord } | undefined> {
    const started = Date.now();
    const content: ContentBlock[] = [];
    const appendText = (type: 'text' | 'thinking', text: string): void => appendStreamedText(content, type, text);
    try {
      for await (const event of this.deps.model.stream(request, signal)) {
        if (signal.aborted) return undefined;
        switch (event.type) {
          case 'text_delta':
            appendText('text', event.text);
            this.deps.sink.delta?.('agent.message', event.text);
            break;
          case 'thinking_delta':
            appendText('thinking', event.text);
            this.deps.sink.delta?.('agent.thinking', event.text);
            break;
          case 'tool_use':
            content.push({ type: 'tool_use', id: event.id, name: event.name, input: event.input });
            break;
          case 'error':
            throw new HarnessError('model_error', `model step failed: ${event.error.type}: ${event.error.message}`, event.error);
          case 'end':
            return {
              content,
              record: { index, usage: event.usage, provider: event.provider, model: event.model, stop_reason: event.stop_reason, duration_ms: Date.now() - started },
            };
        }
      }
    } catch (err) {
      if (signal.aborted && !(err instanceof HarnessError)) return undefined;
      throw err;
    }
    if (signal.aborted) return undefined;
    throw new HarnessError('model_error', 'the model stream ended without an end event', { type: 'runtime.internal', message: 'stream ended early', retryable: true });
  }
}
