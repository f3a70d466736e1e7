import { ZERO_USAGE, type ModelRequest, type ModelStreamEvent, type StopReason, type TokenUsage } from '@agentplane/protocol';
import type { ProviderAdapter, ProviderCall } from './adapter.js';
import { ProviderError } from './errors.js';
import { getJson, joinUrl, parseToolInput, postSse, toolCallBudget } from './http.js';
import { tokenCount, wireObjects, wireString } from './wire-values.js';

export const OPENAI_DEFAULT_BASE_URL = 'https://api.openai.com/v1';

type ChatMessage =
  | { role: 'system'; content: string }
  | { role: 'user'; content: string | ({ type: 'text'; text: string } | { type: 'image_url'; image_url: { url: string } })[] }
  | { role: 'assistant'; content: string | null; tool_calls?: { id: string; type: 'function'; function: { name: string; arguments: string } }[] }
  | { role: 'tool'; tool_call_id: string; content: string };

/** The Chat Completions request body for a neutral request. */
export function toChatCompletionsBody(request: ModelRequest, model: string, options: { maxTokensField?: 'max_tokens' | 'max_completion_tokens' } = {}): Record<string, unknown> {
  const messages: ChatMessage[] = [];
  if (request.system) messages.push({ role: 'system', content: request.system });
  for (const m of request.messages) {
    if (m.role === 'assistant') {
      const text = m.content.filter((b) => b.type === 'text').map((b) => b.text).join('');
      const calls = m.content.flatMap((b) =>
        b.type === 'tool_use' ? [{ id: b.id, type: 'function' as const, function: { name: b.name, arguments: JSON.stringify(b.input ?? {}) } }] : [],
      );
      messages.push({ role: 'assistant', content: text === '' && calls.length > 0 ? null : text, ...(calls.length > 0 ? { tool_calls: calls } : {}) });
      continue;
    }
    // Tool results answer the previous assistant turn, so they come before any new user text.
    const images: { type: 'image_url'; image_url: { url: string } }[] = [];
    for (const b of m.content) {
      if (b.type === 'tool_result') {
        messages.push({ role: 'tool', tool_call_id: b.tool_use_id, content: b.is_error ? `ERROR: ${b.content}` : b.content });
        for (const i of b.images ?? []) images.push({ type: 'image_url', image_url: { url: `data:${i.media_type};base64,${i.data}` } });
      }
    }
    // Tool messages carry text only: images a tool returned follow as one user message.
    if (images.length > 0) messages.push({ role: 'user', content: [{ type: 'text', text: 'Images returned by the tool calls above:' }, ...images] });
    const text = m.content.filter((b) => b.type === 'text').map((b) => b.text).join('\n');
    if (text !== '') messages.push({ role: 'user', content: text });
  }
  const body: Record<string, unknown> = { model, messages, stream: true, stream_options: { include_usage: true } };
  if (request.tools.length > 0) {
    body.tools = request.tools.map((t) => ({ type: 'function', function: { name: t.name, description: t.description, parameters: t.input_schema } }));
  }
  // OpenAI's own API wants max_completion_tokens (reasoning models reject max_tokens); compatible servers know max_tokens.
  if (request.max_output_tokens !== undefined) body[options.maxTokensField ?? 'max_tokens'] = request.max_output_tokens;
  if (request.temperature !== undefined) body.temperature = request.temperature;
  return body;
}

interface ChunkToolCall {
  index?: number;
  id?: string;
  function?: { name?: string; arguments?: string };
}
interface Chunk {
  model?: string;
  choices?: {
    delta?: { content?: string | null; reasoning_content?: string | null; reasoning?: string | null; tool_calls?: ChunkToolCall[] };
    finish_reason?: string | null;
  }[];
  usage?: {
    prompt_tokens?: number;
    completion_tokens?: number;
    total_tokens?: number;
    prompt_tokens_details?: { cached_tokens?: number } | null;
    completion_tokens_details?: { reasoning_tokens?: number } | null;
  } | null;
  error?: { message?: string; code?: string | number; type?: string };
}

const FINISH: Record<string, StopReason> = {
  stop: 'end_turn',
  tool_calls: 'tool_use',
  function_call: 'tool_use',
  length: 'max_tokens',
  content_filter: 'refusal',
};

/** Token counters of a Chat Completions `usage` object (cached and reasoning tokens are subsets). */
export function openAiUsage(u: NonNullable<Chunk['usage']>): TokenUsage {
  // Counts of another type (a string, a negative or fractional number) are read as 0; cached and
  // reasoning tokens are parts of input and output, the total their sum (docs/MODELS.md).
  const input = tokenCount(u.prompt_tokens);
  const output = tokenCount(u.completion_tokens);
  return {
    input_tokens: input,
    cached_input_tokens: Math.min(input, tokenCount(u.prompt_tokens_details?.cached_tokens)),
    cache_write_input_tokens: 0,
    output_tokens: output,
    reasoning_output_tokens: Math.min(output, tokenCount(u.completion_tokens_details?.reasoning_tokens)),
    total_tokens: input + output,
  };
}

/** A chunk with output, a finish reason, usage or an error (not a keep-alive). */
function chunkHasContent(chunk: Chunk | null): boolean {
  if (!chunk || typeof chunk !== 'object' || chunk.error || chunk.usage) return true;
  return wireObjects<NonNullable<Chunk['choices']>[number]>(chunk.choices).some((c) => {
    const d = c.delta ?? {};
    return Boolean(c.finish_reason || d.content || d.reasoning_content || d.reasoning || (d.tool_calls && d.tool_calls.length > 0));
  });
}

/**
 * OpenAI-compatible Chat Completions (`POST {base_url}/chat/completions`, `stream: true`).
 * Serves OpenAI, vLLM, Ollama (`/v1`), llama.cpp server, LM Studio and hosted compatibles.
 */
export class OpenAiChatAdapter implements ProviderAdapter {
  readonly provider = 'openai';

  private headers(apiKey: string | null): Record<string, string> {
    return apiKey ? { authorization: `Bearer ${apiKey}` } : {};
  }

  async *stream(call: ProviderCall, signal: AbortSignal): AsyncGenerator<ModelStreamEvent> {
    const url = joinUrl(call.baseUrl ?? OPENAI_DEFAULT_BASE_URL, 'chat/completions');
    const tools = new Map<number, { id: string; name: string; args: string }>();
    const countTools = toolCallBudget(this.provider);
    let finish: string | null = null;
    let usage: TokenUsage | null = null;
    let model = call.model;
    const official = new URL(url).hostname === 'api.openai.com';
    const body = toChatCompletionsBody(call.request, call.model, { maxTokensField: official ? 'max_completion_tokens' : 'max_tokens' });
    // Each chunk is parsed once, by the watchdog's question (does it carry content? a chunk with
    // no choices and no usage, or an empty delta, does not: a keep-alive), and used below.
    let parsed: Chunk | null = null;
    const isContent = (m: { data: string }): boolean => {
      parsed = null;
      if (m.data === '[DONE]') return true;
      try {
        parsed = JSON.parse(m.data) as Chunk;
      } catch {
        return true;
      }
      return chunkHasContent(parsed);
    };
    const sse = postSse(this.provider, url, this.headers(call.apiKey), body, signal, { timeoutMs: call.timeoutMs, deadlineMs: call.deadlineMs, isContent });
    for await (const m of sse) {
      if (m.data === '[DONE]') break;
      const chunk = parsed as Chunk | null;
      parsed = null;
      if (!chunk || typeof chunk !== 'object') throw new ProviderError('bad_request', `${this.provider} sent a stream chunk that is not JSON`);
      if (chunk.error) throw new ProviderError('server', `${this.provider} stream error: ${chunk.error.message ?? 'unknown'}`);
      model = wireString(chunk.model) || model;
      if (chunk.usage && typeof chunk.usage === 'object') {
        usage = openAiUsage(chunk.usage);
        call.onUsage?.(usage);
      }
      const choice = wireObjects<NonNullable<Chunk['choices']>[number]>(chunk.choices)[0];
      if (!choice) continue;
      const d = typeof choice.delta === 'object' && choice.delta !== null ? choice.delta : {};
      const thinking = wireString(d.reasoning_content) ?? wireString(d.reasoning);
      if (thinking) yield { type: 'thinking_delta', text: thinking };
      const text = wireString(d.content);
      if (text) yield { type: 'text_delta', text };
      for (const tc of wireObjects<ChunkToolCall>(d.tool_calls)) {
        // A server that leaves out `index` sends each call whole: a new id is a new call.
        const at = typeof tc.index === 'number' && Number.isSafeInteger(tc.index) && tc.index >= 0 ? tc.index : undefined;
        let index = at ?? Math.max(0, tools.size - 1);
        if (at === undefined && tc.id && tools.get(index)?.id && tools.get(index)?.id !== tc.id) index = tools.size;
        if (!tools.has(index)) countTools(true);
        const cur = tools.get(index) ?? { id: '', name: '', args: '' };
        countTools(tc.id);
        countTools(tc.function?.name);
        countTools(tc.function?.arguments);
        const id = wireString(tc.id);
        if (id) cur.id = id;
        // The name comes whole (servers that repeat it in every fragment repeat the same name).
        const name = wireString(tc.function?.name);
        if (name) cur.name = name;
        const args = wireString(tc.function?.arguments);
        if (args) cur.args += args;
        tools.set(index, cur);
      }
      finish = wireString(choice.finish_reason) || finish;
    }
    if (signal.aborted) throw new ProviderError('canceled', 'the model step was canceled');
    if (finish === null && tools.size === 0 && usage === null) {
      throw new ProviderError('server', `${this.provider} ended the stream without a finish reason`);
    }
    // A reply cut by the output limit ends `max_tokens` with no tool calls: the ones it was
    // streaming are unfinished (even arguments that parse may be a prefix), so none is callable.
    if (finish !== null && FINISH[finish] === 'max_tokens') {
      yield { type: 'end', stop_reason: 'max_tokens', usage: usage ?? { ...ZERO_USAGE }, provider: this.provider, model };
      return;
    }
    const ordered = [...tools.entries()].sort((a, b) => a[0] - b[0]);
    for (const [i, t] of ordered) {
      yield { type: 'tool_use', id: t.id || `call_${i}`, name: t.name, input: parseToolInput(t.args) };
    }
    const stop: StopReason = ordered.length > 0 ? 'tool_use' : FINISH[finish ?? 'stop'] ?? 'end_turn';
    yield { type: 'end', stop_reason: stop, usage: usage ?? { ...ZERO_USAGE }, provider: this.provider, model };
  }

  async probe(call: Omit<ProviderCall, 'request' | 'model'>, signal: AbortSignal): Promise<void> {
    await getJson(this.provider, joinUrl(call.baseUrl ?? OPENAI_DEFAULT_BASE_URL, 'models'), this.headers(call.apiKey), signal);
  }
}
