import type { ModelRequest, ModelStreamEvent } from '@agentplane/protocol';

/** One provider call: the neutral request plus what the chosen candidate and credential say. */
export interface ProviderCall {
  request: ModelRequest;
  /** The provider's own model name, e.g. `gpt-4.1-mini`, `claude-sonnet-4-5`, `llama3.1:8b`. */
  model: string;
  /** Base URL of the provider API; adapters fall back to the provider's public endpoint. */
  baseUrl: string | null;
  /** The provider secret, decrypted in memory for this call only (null for keyless servers). */
  apiKey: string | null;
  /** Time allowed until the response headers, and between two stream chunks. Default 60 s. */
  timeoutMs?: number;
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
