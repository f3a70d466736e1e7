/**
 * What the runner holds a colocated harness to beyond well-formed lines: the runner sees every
 * model step it relays, so a harness can only report what the model said (each step's text and
 * thinking, as the split loop reports them, once) and tool uses the model actually made (with
 * the name the model gave), classified as blocking exactly as the runner's own policy says, each
 * answered at most once; it can call an MCP tool (which leaves the sandbox) only for such a tool
 * use, and an `always_ask` one only after `user.tool_confirmation` allowed it; it can stop with
 * `requires_action` only on blocking uses; and it gets at most `max_steps` model steps.
 *
 * Under governance (ActionPolicies), every tool use must have been put to the control plane
 * (`tool.check`, answered from the runner's own record of the use) before the harness reports
 * it; a denied use may only be reported as refused (the refusal text, `denied`, the rule), is
 * never called through the runner, and its refusal is what the model must be shown; a use whose
 * policy requires approval is blocking and is not run in this Run (its ActionApproval is resolved
 * in the control plane; a later Run's check of the use says allow or deny).
 */
import type { ContentBlock, ModelMessage, ModelStreamEvent } from '@agentplane/protocol';
import type { IdleStopReason, ToolUsePayload } from '../events.js';
import { appendStreamedText, policyRefusal, type GateDecision, type GateQuery, type PendingResponses } from '../loop.js';
import { builtinTool } from '../tools/builtin.js';
import { QUESTION_TOOL_NAME, questionInputError } from '../tools/question.js';
import { RelayError, STOPPED_DECISION, type RelayEvent, type RelayTool } from './protocol.js';

export const DEFAULT_MAX_STEPS = 100;

function violation(message: string): never {
  throw new RelayError('protocol_violation', message);
}

export class RunAudit {
  /** Tool uses the model made in this Run (relayed by the runner): id → name. */
  private readonly modelUses = new Map<string, string>();
  /** Tool uses of the thread's last assistant message (the previous Run's): id → name. */
  private readonly earlierUses = new Map<string, string>();
  /** Inputs of the tool uses above, as the model gave them (what the policy check is about). */
  private readonly inputs = new Map<string, unknown>();
  /** The control plane's decision on each tool use checked in this Run. */
  private readonly decisions = new Map<string, GateDecision>();
  private readonly checking = new Set<string>();
  /** The runner told the harness to stop: uses not decided by then are refused (`STOPPED_DECISION`). */
  private stopped = false;
  private readonly reported = new Set<string>();
  private readonly answered = new Set<string>();
  private readonly called = new Set<string>();
  /** Files stored for browser_screenshot uses: tool use id → File id. */
  private readonly stored = new Map<string, string>();
  private steps = 0;
  /** The blocks of each model stream under way, as the split loop gathers them (text and thinking merged while they run on). */
  private readonly streaming = new Map<string, ContentBlock[]>();
  /**
   * What finished model steps said and the harness has not reported yet: per kind, each step's
   * blocks' texts (JSON of the list), as `agent.message` and `agent.thinking` must carry them.
   */
  private readonly said: Record<'text' | 'thinking', string[]> = { text: [], thinking: [] };

  constructor(
    private readonly tools: readonly RelayTool[],
    history: readonly ModelMessage[],
    private readonly responses: PendingResponses = {},
    private readonly maxSteps: number = DEFAULT_MAX_STEPS,
    /** Whether ActionPolicies govern this Run (every tool use must be checked first). */
    private readonly governed: boolean = false,
  ) {
    const last = [...history].reverse().find((m) => m.role === 'assistant');
    for (const b of last?.content ?? []) {
      if (b.type !== 'tool_use') continue;
      this.earlierUses.set(b.id, b.name);
      this.inputs.set(b.id, b.input);
    }
  }

  /** The harness asks for the policy check of a tool use: what to ask, from the runner's own record. */
  checkQuery(toolUseId: string): GateQuery {
    const name = this.nameOf(toolUseId);
    if (name === undefined) violation(`tool.check for ${toolUseId}, which is not a tool use of this thread`);
    if (this.checking.has(toolUseId)) violation(`tool.check for ${toolUseId} was asked twice`);
    this.checking.add(toolUseId);
    return { tool_use_id: toolUseId, tool: this.gateTool(name), input: this.inputs.get(toolUseId) };
  }

  /** The control plane's answer to a check (recorded before the harness hears it; the first decision stands). */
  decided(toolUseId: string, decision: GateDecision): void {
    if (!this.decisions.has(toolUseId)) this.decisions.set(toolUseId, this.stopped ? STOPPED_DECISION : decision);
  }

  /** The runner sent `abort`: every use not decided yet is refused, as the harness answers it. */
  stop(): void {
    this.stopped = true;
  }

  /** The decision on a use; under governance a use never checked is a violation. */
  private decisionOf(toolUseId: string, what: string): GateDecision | undefined {
    if (!this.governed) return undefined;
    let d = this.decisions.get(toolUseId);
    if (!d && this.stopped) {
      d = STOPPED_DECISION;
      this.decisions.set(toolUseId, d);
    }
    if (!d) violation(`${what} for ${toolUseId} before its policy check was answered`);
    return d;
  }

  /** How the policy sees a tool by name (as the split loop asks). */
  private gateTool(name: string): GateQuery['tool'] {
    for (const tool of this.tools) {
      if (tool.type === 'custom' && tool.spec.name === name) return { kind: 'custom', name };
      if (tool.type === 'external' && tool.spec.name === name) {
        return tool.mcp ? { kind: 'mcp', name: tool.mcp.tool, connection_id: tool.mcp.connection_id } : { kind: 'custom', name };
      }
      if (tool.type === 'builtin' && tool.name === name) return { kind: 'builtin', name };
    }
    return { kind: 'builtin', name };
  }

  /** What answers a use of this tool, by the runner's policy (as the split loop classifies it). */
  awaiting(name: string): ToolUsePayload['awaiting'] {
    for (const tool of this.tools) {
      if (tool.type === 'custom' && tool.spec.name === name) return 'custom_tool_result';
      if (tool.type === 'external' && tool.spec.name === name) return tool.permission === 'always_ask' ? 'tool_confirmation' : undefined;
      if (tool.type === 'builtin' && tool.name === name && name === QUESTION_TOOL_NAME) return 'question_answer';
      if (tool.type === 'builtin' && tool.name === name) {
        if (!builtinTool(name)) return undefined;
        return tool.permission === 'always_ask' ? 'tool_confirmation' : undefined;
      }
    }
    return undefined;
  }

  private nameOf(toolUseId: string): string | undefined {
    return this.modelUses.get(toolUseId) ?? this.earlierUses.get(toolUseId);
  }

  /** What answers a tool use of this thread (undefined: not blocking, or not a use of this thread). */
  awaitingOfUse(toolUseId: string): ToolUsePayload['awaiting'] {
    const name = this.nameOf(toolUseId);
    if (name === undefined) return undefined;
    // A malformed question is answered at once by the split loop, so it never waits.
    if (name === QUESTION_TOOL_NAME && this.inputs.has(toolUseId) && questionInputError(this.inputs.get(toolUseId)) !== null) return undefined;
    const base = this.awaiting(name);
    const d = this.decisions.get(toolUseId);
    if (d?.decision === 'deny') return undefined;
    if (d?.decision === 'require_approval' && base !== 'custom_tool_result' && base !== 'question_answer') return 'tool_confirmation';
    return base;
  }

  /** A model step is about to be relayed. */
  modelRequest(): void {
    this.steps += 1;
    if (this.steps > this.maxSteps) violation(`the harness asked for more than ${this.maxSteps} model steps in one Run`);
  }

  /** An event the gateway streamed to the harness, on the model stream `stream`. */
  modelEvent(event: ModelStreamEvent, stream = ''): void {
    let blocks = this.streaming.get(stream);
    if (!blocks) this.streaming.set(stream, (blocks = []));
    if (event.type === 'text_delta' || event.type === 'thinking_delta') {
      appendStreamedText(blocks, event.type === 'text_delta' ? 'text' : 'thinking', event.text);
    } else if (event.type === 'tool_use') {
      blocks.push({ type: 'tool_use', id: event.id, name: event.name, input: event.input });
      this.modelUses.set(event.id, event.name);
      this.inputs.set(event.id, event.input);
    } else if (event.type === 'end' || event.type === 'error') {
      this.streaming.delete(stream);
      if (event.type === 'error') return;
      for (const kind of ['text', 'thinking'] as const) {
        const texts = blocks.flatMap((b) => (b.type === kind ? [b.text] : []));
        if (texts.length > 0) this.said[kind].push(JSON.stringify(texts));
      }
    }
  }

  /** The relay of a model stream ended (aborted or broken before its end): what it streamed was never a step. */
  modelStreamClosed(stream: string): void {
    this.streaming.delete(stream);
  }

  /**
   * A model request the harness wants relayed: under governance, a tool result it shows the model
   * for a use of this thread must follow that use's decision (a denied use: the refusal only).
   */
  modelMessages(messages: readonly ModelMessage[]): void {
    if (!this.governed) return;
    for (const m of messages) {
      for (const b of m.content) {
        if (b.type !== 'tool_result') continue;
        const d = this.decisions.get(b.tool_use_id);
        if (d?.decision === 'deny' && b.content !== policyRefusal(d)) violation(`the model request shows ${b.tool_use_id}, refused by policy, as something other than the refusal`);
      }
    }
  }

  /** An event the harness wants appended to the Session log. */
  event(e: RelayEvent): void {
    if (e.type === 'agent.message' || e.type === 'agent.thinking') {
      // What a finished model step of this Run said, as the step said it, reported once: a
      // process in the sandbox writing to the harness's output cannot put words in the model's mouth.
      const kind = e.type === 'agent.message' ? 'text' : 'thinking';
      const i = this.said[kind].indexOf(JSON.stringify(e.payload.content.map((b) => b.text)));
      if (i < 0) violation(`${e.type} does not say what a model step of this Run said (or says it again)`);
      this.said[kind].splice(i, 1);
    } else if (e.type === 'agent.tool_use') {
      const { id, name, awaiting } = e.payload;
      if (this.modelUses.get(id) !== name) violation(`agent.tool_use ${id} (${name}) is not a tool use the model made in this Run`);
      if (this.reported.has(id)) violation(`agent.tool_use ${id} was reported twice`);
      this.decisionOf(id, 'agent.tool_use');
      if (awaiting !== this.awaitingOfUse(id)) violation(`agent.tool_use ${id} of ${name} is not classified as the agent's tool policy says`);
      this.reported.add(id);
    } else if (e.type === 'agent.tool_result') {
      const id = e.payload.tool_use_id;
      if (!this.nameOf(id)) violation(`agent.tool_result answers ${id}, which is not a tool use of this thread`);
      if (this.answered.has(id)) violation(`agent.tool_result for ${id} was reported twice`);
      const d = this.decisionOf(id, 'agent.tool_result');
      if (d?.decision === 'deny') {
        const p = e.payload;
        if (p.denied !== true || p.is_error !== true || p.content !== policyRefusal(d) || (p.policy_rule_id ?? null) !== d.rule_id) {
          violation(`agent.tool_result for ${id}, refused by policy, is not reported as that refusal`);
        }
      } else if (d?.decision === 'require_approval' && e.payload.denied !== true) {
        violation(`agent.tool_result for ${id}, which waits for its ActionApproval, reports it as run`);
      }
      if (e.payload.file_id !== undefined && this.stored.get(id) !== e.payload.file_id) violation(`agent.tool_result for ${id} names ${e.payload.file_id}, which the runner did not store for it`);
      this.answered.add(id);
    }
  }

  /** The harness asks the runner to call an MCP tool; returns the tool to call. */
  toolCall(toolUseId: string, name: string): Extract<RelayTool, { type: 'external' }> {
    const tool = this.tools.find((t): t is Extract<RelayTool, { type: 'external' }> => t.type === 'external' && t.spec.name === name);
    if (!tool) violation(`tool.call names ${name}, which is not an MCP tool of the agent`);
    if (this.nameOf(toolUseId) !== name) violation(`tool.call for ${toolUseId} is not a use of ${name} the model made`);
    if (this.called.has(toolUseId)) violation(`tool.call for ${toolUseId} was made twice`);
    const d = this.decisionOf(toolUseId, 'tool.call');
    if (d?.decision === 'deny') violation(`tool.call for ${toolUseId}: refused by the workspace's ActionPolicy`);
    if (d?.decision === 'require_approval') violation(`tool.call for ${toolUseId}: it waits for its ActionApproval`);
    if (tool.permission === 'always_ask' && !(this.earlierUses.has(toolUseId) && this.responses.confirmations?.[toolUseId] === 'allow')) {
      violation(`tool.call for ${toolUseId}: ${name} needs user.tool_confirmation first`);
    }
    this.called.add(toolUseId);
    return tool;
  }

  /**
   * The harness asks the runner to store a screenshot: only for a `browser_screenshot` use the
   * model made in this Run, allowed by policy, once.
   */
  fileStore(toolUseId: string): void {
    if (this.modelUses.get(toolUseId) !== 'browser_screenshot') violation(`file.store for ${toolUseId}: not a browser_screenshot use the model made in this Run`);
    if (this.stored.has(toolUseId)) violation(`file.store for ${toolUseId} was made twice`);
    const d = this.decisionOf(toolUseId, 'file.store');
    if (d?.decision === 'deny' || d?.decision === 'require_approval') violation(`file.store for ${toolUseId}: the use was not allowed to run`);
    this.stored.set(toolUseId, '');
  }

  /** The File stored for a screenshot use (what its tool result may name). */
  fileStored(toolUseId: string, fileId: string): void {
    this.stored.set(toolUseId, fileId);
  }

  /** The harness's stop reason, checked: `requires_action` only names blocking uses of this thread. */
  done(stop: IdleStopReason): IdleStopReason {
    if (stop.type === 'requires_action') {
      for (const id of stop.tool_use_ids) {
        const name = this.nameOf(id);
        if (!name || !this.awaitingOfUse(id)) violation(`requires_action names ${id}, which is not a blocking tool use of this thread`);
      }
    }
    return stop;
  }
}

