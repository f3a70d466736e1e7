/**
 * What the harness loop emits, and where. The sink is abstract: the runner connects it to the
 * gateway's event batches (idempotent appends by producer key); tests collect into an array.
 */
import type { ModelError, TokenUsage, ToolSpec } from '@agentplane/protocol';

export type ToolPermission = 'always_allow' | 'always_ask';

export type AgentTool =
  /**
   * A built-in tool, executed inside the sandbox. `always_ask` waits for `user.tool_confirmation`.
   * `ask_user` is built in too but never runs: it waits for `user.question_answer`.
   */
  | { type: 'builtin'; name: string; permission?: ToolPermission }
  /** A custom tool, executed by the client: the Run ends waiting for `user.custom_tool_result`. */
  | { type: 'custom'; spec: ToolSpec }
  /**
   * A tool the runner calls on the model's behalf outside the sandbox (an MCP server's tool,
   * through the control plane's runtime MCP endpoint). `always_ask` waits for confirmation.
   */
  | {
      type: 'external';
      spec: ToolSpec;
      permission?: ToolPermission;
      /** For a Connection's MCP tool: the Connection and the tool's own name (what ActionPolicies match). */
      mcp?: { connection_id: string; tool: string };
      call: (input: unknown, signal: AbortSignal, toolUseId: string) => Promise<{ content: string; is_error: boolean }>;
    };

export interface AgentConfig {
  /** Model routing key sent with every model step. */
  routing_key: string;
  system?: string;
  tools: AgentTool[];
  max_output_tokens?: number;
  temperature?: number;
  /** Bound on model steps in one Run (default 100). */
  max_steps?: number;
}

/** Why a Run stopped; carried by `session.status_idle` as `stop_reason`. */
export type IdleStopReason =
  | { type: 'end_turn' }
  | { type: 'max_tokens' }
  | { type: 'refusal' }
  | { type: 'interrupted' }
  | { type: 'max_duration' }
  | { type: 'max_steps' }
  /** Intermediate Run boundary: the listed blocking tool uses wait for a drive event. */
  | { type: 'requires_action'; tool_use_ids: string[] };

/** What answers a blocking tool use. */
export type Awaiting = 'custom_tool_result' | 'tool_confirmation' | 'question_answer';

export interface ToolUsePayload {
  id: string;
  name: string;
  input: unknown;
  /** A blocking use ends the Run; it is answered by `user.custom_tool_result`, `user.tool_confirmation` or `user.question_answer`. */
  blocking: boolean;
  /** What answers a blocking use. */
  awaiting?: Awaiting;
}

export type HarnessEvent =
  | { type: 'agent.thinking'; payload: { content: Array<{ type: 'thinking'; text: string }> } }
  | { type: 'agent.message'; payload: { content: Array<{ type: 'text'; text: string }> } }
  | { type: 'agent.tool_use'; payload: ToolUsePayload }
  | {
      type: 'agent.tool_result';
      payload: {
        tool_use_id: string;
        content: string;
        is_error: boolean;
        /** Set when the tool was denied through `user.tool_confirmation`. */
        denied?: boolean;
        /** Set when an ActionPolicy refused the tool use: the deciding rule. */
        policy_rule_id?: string;
        exit_code?: number;
        timed_out?: boolean;
        oom_killed?: boolean;
        interrupted?: boolean;
        duration_ms?: number;
        /** The File a tool stored (a browser screenshot), instead of its bytes. */
        file_id?: string;
      };
    }
  | { type: 'session.status_idle'; payload: { stop_reason: IdleStopReason; usage: TokenUsage } };

export type HarnessEventType = HarnessEvent['type'];

/** An ACP agent's plan (docs/ACP.md): the whole list each time it changes. */
export interface PlanEvent {
  type: 'agent.plan';
  payload: { entries: Array<{ content: string; priority: string; status: string }> };
}

/** One model step's accounting. */
export interface StepRecord {
  index: number;
  usage: TokenUsage;
  provider: string;
  model: string;
  stop_reason: string;
  duration_ms: number;
}

export interface SessionEventSink {
  /** Appends one event to the thread's log. `session_thread_id` is set for child threads. */
  emit(event: HarnessEvent & { session_thread_id?: string }): Promise<void>;
  /** Optional uncursored preview frames (`event_deltas`). */
  delta?(type: 'agent.message' | 'agent.thinking', text: string): void;
  /** Called after every model step with its token usage. */
  step?(record: StepRecord): void;
}

/** A failure the Run could not absorb; the caller decides between retry and `session.status_failed`. */
export class HarnessError extends Error {
  constructor(
    readonly reason: 'model_error' | 'sandbox_error' | 'invalid_history',
    message: string,
    readonly modelError?: ModelError,
    options?: { cause?: unknown },
  ) {
    super(message, options);
    this.name = 'HarnessError';
  }

  get retryable(): boolean {
    return this.reason === 'sandbox_error' || (this.modelError?.retryable ?? false);
  }
}
