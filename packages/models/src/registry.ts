import type { ProviderAdapter } from './adapter.js';
import { AnthropicMessagesAdapter } from './anthropic.js';
import { OpenAiChatAdapter } from './openai.js';
import { ScriptedAdapter } from './scripted.js';

/** The provider keys a ModelCredential may name. */
export const PROVIDER_KEYS = ['openai', 'anthropic', 'scripted'] as const;
export type ProviderKey = (typeof PROVIDER_KEYS)[number];

/** Providers that need no secret. `openai` may be keyless too (a local Ollama or vLLM). */
export const KEYLESS_PROVIDERS: ReadonlySet<ProviderKey> = new Set(['scripted']);

export function defaultAdapters(): Record<ProviderKey, ProviderAdapter> {
  return { openai: new OpenAiChatAdapter(), anthropic: new AnthropicMessagesAdapter(), scripted: new ScriptedAdapter() };
}
