import type { ErrorType } from '@agentplane/core';
/**
 * model-gateway-v1: the provider-neutral shape of a model step. The harness (in the runner)
 * sends a ModelRequest by routing key; the control plane resolves the routing profile, calls
 * a provider adapter, and streams ModelStreamEvents back. Adapters translate to and from
 * each provider's wire format; the scripted provider produces them deterministically.
 */
export const MODEL_GATEWAY_PROTOCOL = 'model-gateway-v1';

export type ContentBlock =
  | { type: 'text'; text: string }
  | { type: 'thinking'; text: string }
  | { type: 'tool_use'; id: string; name: string; input: unknown }
  | { type: 'tool_result'; tool_use_id: string; content: string; is_error?: boolean; images?: ImageContent[] };

/**
 * An image a tool returned (a browser screenshot), base64 in the model request only: the
 * Session's event log names the File that holds it instead.
 */
export interface ImageContent {
  type: 'image';
  media_type: 'image/png' | 'image/jpeg';
  /** Base64 of the image bytes. */
  data: string;
}

export interface ModelMessage {
  role: 'user' | 'assistant';
  content: ContentBlock[];
}

export interface ToolSpec {
  name: string;
  description: string;
  /** JSON Schema of the tool input. */
  input_schema: Record<string, unknown>;
}

export interface ModelRequest {
  /** Logical key of the model routing profile (`^[a-z0-9](?:[a-z0-9._-]{0,93})$`). */
  routing_key: string;
  system?: string;
  messages: ModelMessage[];
  tools: ToolSpec[];
  max_output_tokens?: number;
  temperature?: number;
}

/** The token counters used everywhere (Run, thread, Session, workspace, SkillProposal `usage`). */
export interface TokenUsage {
  input_tokens: number;
  cached_input_tokens: number;
  cache_write_input_tokens: number;
  output_tokens: number;
  reasoning_output_tokens: number;
  total_tokens: number;
}

export const ZERO_USAGE: TokenUsage = Object.freeze({
  input_tokens: 0,
  cached_input_tokens: 0,
  cache_write_input_tokens: 0,
  output_tokens: 0,
  reasoning_output_tokens: 0,
  total_tokens: 0,
});

export function addUsage(a: TokenUsage, b: Partial<TokenUsage>): TokenUsage {
  return {
    input_tokens: a.input_tokens + (b.input_tokens ?? 0),
    cached_input_tokens: a.cached_input_tokens + (b.cached_input_tokens ?? 0),
    cache_write_input_tokens: a.cache_write_input_tokens + (b.cache_write_input_tokens ?? 0),
    output_tokens: a.output_tokens + (b.output_tokens ?? 0),
    reasoning_output_tokens: a.reasoning_output_tokens + (b.reasoning_output_tokens ?? 0),
    total_tokens: a.total_tokens + (b.total_tokens ?? 0),
  };
}

export type StopReason = 'end_turn' | 'tool_use' | 'max_tokens' | 'refusal' | 'canceled';

export interface ModelError {
  /** One of the API's error types (the contract's catalog): model.no_eligible_model, model.platform_capacity_reached, budget.exceeded, runtime.internal, … */
  type: ErrorType;
  message: string;
  /** Whether the step may be retried (the gateway already tried every fallback candidate). */
  retryable: boolean;
  /** Seconds until a retry may succeed, when known (provider Retry-After, budget reset). */
  retry_after_seconds?: number;
}

export type ModelStreamEvent =
  | { type: 'text_delta'; text: string }
  | { type: 'thinking_delta'; text: string }
  /** A complete tool call (adapters assemble streamed argument fragments). */
  | { type: 'tool_use'; id: string; name: string; input: unknown }
  | {
      type: 'end';
      stop_reason: StopReason;
      usage: TokenUsage;
      /** Which candidate served the step. */
      provider: string;
      model: string;
    }
  | { type: 'error'; error: ModelError };

/** Anything that can run a model step: a provider adapter, the gateway client in the runner. */
export interface ModelClient {
  stream(request: ModelRequest, signal: AbortSignal): AsyncIterable<ModelStreamEvent>;
}

/**
 * Where a Run places its skills, relative to the sandbox workspace (read-only). Here, in the
 * module the in-sandbox harness bundles, for the runner and the domain alike.
 */
export const SKILLS_DIR = '.agentplane/skills';
/**
 * The built-in tool a Run's model opens a skill with (`{name}` → its `SKILL.md`), offered
 * beside the Agent's tools whenever the Run places skills: no custom tool may take its name.
 */
export const SKILL_TOOL_NAME = 'skill';
