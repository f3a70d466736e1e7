/**
 * What the runner holds a colocated harness to beyond well-formed lines: the runner sees every
 * model step it relays, so a harness can only report tool uses the model actually made (with
 * the name the model gave), classified as blocking exactly as the runner's own policy says, each
 * answered at most once; it can call an MCP tool (which leaves the sandbox) only for such a tool
 * use, and an `always_ask` one only after `user.tool_confirmation` allowed it; it can stop with
 * `requires_action` only on blocking uses; and it gets at most `max_steps` model steps.
 */
import type { ModelMessage, ModelStreamEvent } from '@agentplane/protocol';
import type { IdleStopReason, ToolUsePayload } from '../events.js';
import type { PendingResponses } from '../loop.js';
import { builtinTool } from '../tools/builtin.js';
import { RelayError, type RelayEvent, type RelayTool } from './protocol.js';

export const DEFAULT_MAX_STEPS = 100;

function violation(message: string): never {
  throw new RelayError('protocol_violation', message);
}

export class RunAudit {
  /** Tool uses the model made in this Run (relayed by the runner): id → name. */
  private readonly modelUses = new Map<string, string>();
  /** Tool uses of the thread's last assistant message (the previous Run's): id → name. */
  private readonly earlierUses = new Map<string, string>();
  private readonly reported = new Set<string>();
  private readonly answered = new Set<string>();
  private readonly called = new Set<string>();
  private steps = 0;

  constructor(
    private readonly tools: readonly RelayTool[],
    history: readonly ModelMessage[],
    private readonly responses: PendingResponses = {},
    private readonly maxSteps: number = DEFAULT_MAX_STEPS,
  ) {
    const last = [...history].reverse().find((m) => m.role === 'assistant');
    for (const b of last?.content ?? []) if (b.type === 'tool_use') this.earlierUses.set(b.id, b.name);
  }

  /** What answers a use of this tool, by the runner's policy (as the split loop classifies it). */
  awaiting(name: string): ToolUsePayload['awaiting'] {
    for (const tool of this.tools) {
      if (tool.type === 'custom' && tool.spec.name === name) return 'custom_tool_result';
      if (tool.type === 'external' && tool.spec.name === name) return tool.permission === 'always_ask' ? 'tool_confirmation' : undefined;
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
    return name === undefined ? undefined : this.awaiting(name);
  }

  /** A model step is about to be relayed. */
  modelRequest(): void {
    this.steps += 1;
    if (this.steps > this.maxSteps) violation(`the harness asked for more than ${this.maxSteps} model steps in one Run`);
  }

  /** An event the gateway streamed to the harness. */
  modelEvent(event: ModelStreamEvent): void {
    if (event.type === 'tool_use') this.modelUses.set(event.id, event.name);
  }

  /** An event the harness wants appended to the Session log. */
  event(e: RelayEvent): void {
    if (e.type === 'agent.tool_use') {
      const { id, name, awaiting } = e.payload;
      if (this.modelUses.get(id) !== name) violation(`agent.tool_use ${id} (${name}) is not a tool use the model made in this Run`);
      if (this.reported.has(id)) violation(`agent.tool_use ${id} was reported twice`);
      if (awaiting !== this.awaiting(name)) violation(`agent.tool_use ${id} of ${name} is not classified as the agent's tool policy says`);
      this.reported.add(id);
    } else if (e.type === 'agent.tool_result') {
      const id = e.payload.tool_use_id;
      if (!this.nameOf(id)) violation(`agent.tool_result answers ${id}, which is not a tool use of this thread`);
      if (this.answered.has(id)) violation(`agent.tool_result for ${id} was reported twice`);
      this.answered.add(id);
    }
  }

  /** The harness asks the runner to call an MCP tool; returns the tool to call. */
  toolCall(toolUseId: string, name: string): Extract<RelayTool, { type: 'external' }> {
    const tool = this.tools.find((t): t is Extract<RelayTool, { type: 'external' }> => t.type === 'external' && t.spec.name === name);
    if (!tool) violation(`tool.call names ${name}, which is not an MCP tool of the agent`);
    if (this.nameOf(toolUseId) !== name) violation(`tool.call for ${toolUseId} is not a use of ${name} the model made`);
    if (this.called.has(toolUseId)) violation(`tool.call for ${toolUseId} was made twice`);
    if (tool.permission === 'always_ask' && !(this.earlierUses.has(toolUseId) && this.responses.confirmations?.[toolUseId] === 'allow')) {
      violation(`tool.call for ${toolUseId}: ${name} needs user.tool_confirmation first`);
    }
    this.called.add(toolUseId);
    return tool;
  }

  /** The harness's stop reason, checked: `requires_action` only names blocking uses of this thread. */
  done(stop: IdleStopReason): IdleStopReason {
    if (stop.type === 'requires_action') {
      for (const id of stop.tool_use_ids) {
        const name = this.nameOf(id);
        if (!name || !this.awaiting(name)) violation(`requires_action names ${id}, which is not a blocking tool use of this thread`);
      }
    }
    return stop;
  }
}

