import { ZERO_USAGE, type ModelRequest, type ModelStreamEvent, type StopReason, type TokenUsage } from '@agentplane/protocol';
import type { ProviderAdapter, ProviderCall } from './adapter.js';
import { ProviderError, type ProviderErrorKind } from './errors.js';
import { getJson, joinUrl, parseToolInput, postSse, toolCallBudget } from './http.js';
import { tokenCount, wireString } from './wire-values.js';

export const ANTHROPIC_DEFAULT_BASE_URL = 'https://api.anthropic.com';
export const ANTHROPIC_VERSION = '2023-06-01';
const DEFAULT_MAX_TOKENS = 4096;

type Block =
  | { type: 'text'; text: string }
  | { type: 'tool_use'; id: string; name: string; input: unknown }
  | { type: 'tool_result'; tool_use_id: string; content: string | ToolResultPart[]; is_error?: boolean };
type ToolResultPart = { type: 'text'; text: string } | { type: 'image'; source: { type: 'base64'; media_type: string; data: string } };

/** The Messages API request body for a neutral request. */
export function toMessagesBody(request: ModelRequest, model: string): Record<string, unknown> {
  const messages = request.messages
    .map((m) => ({
      role: m.role,
      // Earlier thinking is dropped: replaying it needs the provider's signature, which is not kept.
      content: m.content.flatMap((b): Block[] => {
        if (b.type === 'thinking') return [];
        if (b.type === 'tool_result') {
          // Images a tool returned go beside its text as image blocks of the tool result.
          const content: string | ToolResultPart[] = b.images?.length
            ? [{ type: 'text', text: b.content }, ...b.images.map((i): ToolResultPart => ({ type: 'image', source: { type: 'base64', media_type: i.media_type, data: i.data } }))]
            : b.content;
          return [{ type: 'tool_result', tool_use_id: b.tool_use_id, content, ...(b.is_error ? { is_error: true } : {}) }];
        }
        return [b];
      }),
    }))
    .filter((m) => m.content.length > 0);
  const body: Record<string, unknown> = {
    model,
    max_tokens: request.max_output_tokens ?? DEFAULT_MAX_TOKENS,
    messages,
    stream: true,
  };
  if (request.system) body.system = request.system;
  if (request.tools.length > 0) body.tools = request.tools.map((t) => ({ name: t.name, description: t.description, input_schema: t.input_schema }));
  if (request.temperature !== undefined) body.temperature = request.temperature;
  return body;
}

interface AnthropicUsage {
  input_tokens?: number | null;
  output_tokens?: number | null;
  cache_creation_input_tokens?: number | null;
  cache_read_input_tokens?: number | null;
}
interface StreamEvent {
  type: string;
  index?: number;
  message?: { model?: string; usage?: AnthropicUsage };
  content_block?: { type: string; id?: string; name?: string; text?: string; thinking?: string };
  delta?: { type?: string; text?: string; thinking?: string; partial_json?: string; stop_reason?: string | null };
  usage?: AnthropicUsage;
  error?: { type?: string; message?: string };
}

/**
 * A stream `error` event's type, classified as the same failure over HTTP would be (its status
 * in parentheses); `overloaded_error` (529), `api_error` (500) and unknown types are `server`.
 */
const STREAM_ERROR_KINDS: Record<string, ProviderErrorKind> = {
  invalid_request_error: 'bad_request', // 400
  authentication_error: 'auth', // 401
  billing_error: 'bad_request', // 402
  permission_error: 'auth', // 403
  not_found_error: 'bad_request', // 404
  request_too_large: 'bad_request', // 413
  rate_limit_error: 'rate_limited', // 429
  timeout_error: 'timeout', // 504
};

const STOP: Record<string, StopReason> = {
  end_turn: 'end_turn',
  stop_sequence: 'end_turn',
  tool_use: 'tool_use',
  max_tokens: 'max_tokens',
  refusal: 'refusal',
  pause_turn: 'end_turn',
  model_context_window_exceeded: 'max_tokens',
};

/**
 * Normalise Anthropic counters: its `input_tokens` excludes cache reads and writes, ours
 * (like OpenAI's) include them, so cached and cache-write tokens are subsets of input.
 */
export function anthropicUsage(u: AnthropicUsage): TokenUsage {
  // Counts of another type (a string, a negative or fractional number) are read as 0.
  const cacheRead = tokenCount(u.cache_read_input_tokens);
  const cacheWrite = tokenCount(u.cache_creation_input_tokens);
  const input = tokenCount(u.input_tokens) + cacheRead + cacheWrite;
  const output = tokenCount(u.output_tokens);
  return {
    input_tokens: input,
    cached_input_tokens: cacheRead,
    cache_write_input_tokens: cacheWrite,
    output_tokens: output,
    reasoning_output_tokens: 0,
    total_tokens: input + output,
  };
}

/** Anthropic Messages (`POST {base_url}/v1/messages`, `stream: true`). */
/** The stream events whose content this adapter reads: the progress the idle timeout counts. */
const CONTENT_EVENTS: ReadonlySet<string> = new Set(['message_start', 'content_block_start', 'content_block_delta', 'content_block_stop', 'message_delta', 'message_stop', 'error']);

export class AnthropicMessagesAdapter implements ProviderAdapter {
  readonly provider = 'anthropic';

  private headers(apiKey: string | null): Record<string, string> {
    return { 'anthropic-version': ANTHROPIC_VERSION, ...(apiKey ? { 'x-api-key': apiKey } : {}) };
  }

  async *stream(call: ProviderCall, signal: AbortSignal): AsyncGenerator<ModelStreamEvent> {
    const url = joinUrl(call.baseUrl ?? ANTHROPIC_DEFAULT_BASE_URL, 'v1/messages');
    const blocks = new Map<number, { type: string; id: string; name: string; json: string }>();
    const countTools = toolCallBudget(this.provider);
    let raw: AnthropicUsage = {};
    let stop: string | null = null;
    let model = call.model;
    let stopped = false;
    // Finished tool_use blocks wait for the stop reason: a reply cut by the output limit calls none.
    const calls: ModelStreamEvent[] = [];
    // Each message is parsed once, by the watchdog's question (does it carry content? only an
    // event of a type this adapter reads does: a provider that only pings, or only sends events
    // of no type or of types not read here, still times out), and used below. What is not a JSON
    // object is answered at once by the loop (a refused stream), so it counts as progress here.
    let parsed: StreamEvent | null = null;
    const isContent = (m: { event?: string | undefined; data: string }): boolean => {
      try {
        const value: unknown = JSON.parse(m.data);
        parsed = typeof value === 'object' && value !== null && !Array.isArray(value) ? (value as StreamEvent) : null;
      } catch {
        parsed = null;
      }
      return parsed === null || (m.event !== 'ping' && typeof parsed.type === 'string' && CONTENT_EVENTS.has(parsed.type));
    };
    const sse = postSse(this.provider, url, this.headers(call.apiKey), toMessagesBody(call.request, call.model), signal, { timeoutMs: call.timeoutMs, deadlineMs: call.deadlineMs, isContent });
    for await (const m of sse) {
      const ev = parsed as StreamEvent | null;
      parsed = null;
      if (!ev || m.data === '') throw new ProviderError('bad_request', `${this.provider} sent a stream event that is not a JSON object`);
      switch (ev.type) {
        case 'message_start':
          model = wireString(ev.message?.model) || model;
          if (ev.message?.usage && typeof ev.message.usage === 'object') {
            raw = { ...raw, ...ev.message.usage };
            call.onUsage?.(anthropicUsage(raw));
          }
          break;
        case 'content_block_start': {
          const b = ev.content_block;
          if (!b) break;
          countTools(true);
          countTools(b.id);
          countTools(b.name);
          blocks.set(ev.index ?? 0, { type: b.type, id: wireString(b.id) ?? '', name: wireString(b.name) ?? '', json: '' });
          const text = b.type === 'text' ? wireString(b.text) : b.type === 'thinking' ? wireString(b.thinking) : undefined;
          if (text) yield { type: b.type === 'text' ? 'text_delta' : 'thinking_delta', text };
          break;
        }
        case 'content_block_delta': {
          const d = ev.delta ?? {};
          const text = d.type === 'text_delta' ? wireString(d.text) : d.type === 'thinking_delta' ? wireString(d.thinking) : undefined;
          if (text) yield { type: d.type === 'text_delta' ? 'text_delta' : 'thinking_delta', text };
          else if (d.type === 'input_json_delta' && typeof d.partial_json === 'string' && d.partial_json) {
            const b = blocks.get(ev.index ?? 0);
            countTools(d.partial_json);
            if (b) b.json += d.partial_json;
          }
          break;
        }
        case 'content_block_stop': {
          const b = blocks.get(ev.index ?? 0);
          if (b?.type === 'tool_use') calls.push({ type: 'tool_use', id: b.id, name: b.name, input: parseToolInput(b.json) });
          break;
        }
        case 'message_delta':
          stop = wireString(ev.delta?.stop_reason) || stop;
          // message_delta usage is cumulative; non-null fields replace the message_start values.
          for (const [k, v] of Object.entries(ev.usage ?? {})) if (typeof v === 'number') (raw as Record<string, number>)[k] = v;
          if (ev.usage) call.onUsage?.(anthropicUsage(raw));
          break;
        case 'message_stop':
          stopped = true;
          break;
        case 'error': {
          const t = ev.error?.type ?? 'error';
          const kind = STREAM_ERROR_KINDS[t] ?? 'server';
          throw new ProviderError(kind, `${this.provider} stream error ${t}: ${ev.error?.message ?? ''}`.trim());
        }
        default:
          break; // ping and future event types
      }
      if (stopped) break;
    }
    if (signal.aborted) throw new ProviderError('canceled', 'the model step was canceled');
    if (!stopped) throw new ProviderError('server', `${this.provider} ended the stream before message_stop`);
    const reason = STOP[stop ?? 'end_turn'] ?? 'end_turn';
    // At `max_tokens` the last tool_use block was cut (Anthropic closes it with content_block_stop
    // all the same): no tool call of the reply is callable, as with Chat Completions' `length`.
    if (reason !== 'max_tokens') yield* calls;
    yield { type: 'end', stop_reason: reason, usage: raw ? anthropicUsage(raw) : { ...ZERO_USAGE }, provider: this.provider, model };
  }

  async probe(call: Omit<ProviderCall, 'request' | 'model'>, signal: AbortSignal): Promise<void> {
    await getJson(this.provider, joinUrl(call.baseUrl ?? ANTHROPIC_DEFAULT_BASE_URL, 'v1/models'), this.headers(call.apiKey), signal);
  }
}
