import type { ModelRequest, ModelStreamEvent, TokenUsage } from '@agentplane/protocol';

/** One provider call: the neutral request plus what the chosen candidate and credential say. */
export interface ProviderCall {
  request: ModelRequest;
  /** The provider's own model name, e.g. `gpt-4.1-mini`, `claude-sonnet-4-5`, `llama3.1:8b`. */
  model: string;
  /** Base URL of the provider API; adapters fall back to the provider's public endpoint. */
  baseUrl: string | null;
  /** The provider secret, decrypted in memory for this call only (null for keyless servers). */
  apiKey: string | null;
  /**
   * Time allowed until the response headers, and between two stream messages that carry
   * content (keep-alives such as `ping` events or empty chunks do not count). Default 60 s.
   */
  timeoutMs?: number;
  /** Time allowed for the whole call (the step's deadline, what is left of it). None by default. */
  deadlineMs?: number;
  /**
   * Told the usage the provider reported so far, each time it reports some (Anthropic's
   * `message_start` and `message_delta`, a Chat Completions usage chunk): what a step that ends
   * early (canceled, cut) is charged from.
   */
  onUsage?: (usage: TokenUsage) => void;
}

/**
 * A provider adapter streams neutral events for one call. Failures before or during the stream
 * are thrown as `ProviderError` (classified retryable or not); a caller abort ends the HTTP
 * request and throws `ProviderError('canceled')`.
 */
export interface ProviderAdapter {
  readonly provider: string;
  stream(call: ProviderCall, signal: AbortSignal): AsyncIterable<ModelStreamEvent>;
  /** A cheap authenticated probe (list models); throws `ProviderError` when unhealthy. */
  probe(call: Omit<ProviderCall, 'request' | 'model'>, signal: AbortSignal): Promise<void>;
}
