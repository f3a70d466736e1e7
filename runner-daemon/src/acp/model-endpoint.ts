/**
 * The model endpoint an ACP agent inside the sandbox calls (docs/ACP.md): Anthropic Messages
 * (`POST /v1/messages`) and OpenAI Chat Completions (`POST /v1/chat/completions`), streaming or
 * not, translated to and from model-gateway-v1 and relayed over the lease's model client (the
 * runner's WebSocket; the gateway checks the lease and applies routing, fallback, budgets and
 * usage as for the built-in loop). The agent names whatever model it likes: the step always uses
 * the Run's routing key. A request must carry the lease's placeholder key (`x-api-key` or
 * `Authorization: Bearer`); the agent never sees a provider secret.
 *
 * The server listens on the runner's loopback only; the sandbox reaches it through the
 * forwarder (`./forwarder.ts`), byte for byte over the forwarder's stdio.
 */
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { addUsage, ZERO_USAGE, type ContentBlock, type ModelClient, type ModelError, type ModelMessage, type ModelRequest, type ModelStreamEvent, type StopReason, type TokenUsage, type ToolSpec } from '@agentplane/protocol';

/** Largest request body accepted (the relayed step travels as one runner frame). */
const MAX_BODY_BYTES = 900 * 1024;

type Json = Record<string, unknown>;

export interface ModelEndpointOptions {
  model: ModelClient;
  routingKey: string;
  /** The Agent's own system prompt, added after the ACP agent's (the platform's instructions hold for it too). */
  instructions?: string;
  /** The per-lease placeholder key the agent is given. */
  key: string;
  /** Aborts every open step (the lease's signal). */
  signal: AbortSignal;
  /** Every finished step's usage (the Run's usage). */
  onUsage?: (usage: TokenUsage) => void;
  /** Every step's timing as the runner saw it: to the first event from the gateway, and to its end. */
  onStep?: (timing: { first_event_ms: number; total_ms: number }) => void;
  /** Every gateway error a step ended with. */
  onError?: (error: ModelError) => void;
  /** Extra routes (the runtime MCP proxy); return false when the path is not theirs. */
  extra?: (req: IncomingMessage, res: ServerResponse) => Promise<boolean>;
}

export class ModelEndpointError extends Error {
  constructor(readonly status: number, readonly kind: string, message: string) {
    super(message);
  }
}

const text = (v: unknown): string => (typeof v === 'string' ? v : '');

function blocksOf(content: unknown): Json[] {
  if (typeof content === 'string') return [{ type: 'text', text: content }];
  return Array.isArray(content) ? (content.filter((b) => b && typeof b === 'object') as Json[]) : [];
}

function toolResultText(content: unknown): string {
  if (typeof content === 'string') return content;
  return blocksOf(content).map((b) => (b.type === 'text' ? text(b.text) : `[${text(b.type)}]`)).join('\n');
}

/** Anthropic Messages request → model-gateway-v1. */
export function fromAnthropic(body: Json, routingKey: string): ModelRequest {
  if (!Array.isArray(body.messages)) throw new ModelEndpointError(400, 'invalid_request_error', 'messages: required array');
  const system = typeof body.system === 'string' ? body.system : blocksOf(body.system).map((b) => text(b.text)).join('\n');
  const messages: ModelMessage[] = [];
  for (const m of body.messages as Json[]) {
    const role = m.role === 'assistant' ? 'assistant' : 'user';
    const content: ContentBlock[] = [];
    for (const b of blocksOf(m.content)) {
      if (b.type === 'text') content.push({ type: 'text', text: text(b.text) });
      else if (b.type === 'thinking') content.push({ type: 'thinking', text: text(b.thinking) });
      else if (b.type === 'tool_use') content.push({ type: 'tool_use', id: text(b.id), name: text(b.name), input: b.input ?? {} });
      else if (b.type === 'tool_result') {
        content.push({ type: 'tool_result', tool_use_id: text(b.tool_use_id), content: toolResultText(b.content), ...(b.is_error === true ? { is_error: true } : {}) });
      }
    }
    if (content.length > 0) messages.push({ role, content });
  }
  const tools: ToolSpec[] = Array.isArray(body.tools)
    ? (body.tools as Json[]).filter((t) => typeof t.name === 'string' && t.input_schema).map((t) => ({
        name: text(t.name), description: text(t.description), input_schema: t.input_schema as Record<string, unknown>,
      }))
    : [];
  return {
    routing_key: routingKey,
    ...(system ? { system } : {}),
    messages,
    tools,
    ...(typeof body.max_tokens === 'number' ? { max_output_tokens: body.max_tokens } : {}),
    ...(typeof body.temperature === 'number' ? { temperature: body.temperature } : {}),
  };
}

/** OpenAI Chat Completions request → model-gateway-v1. */
export function fromOpenAi(body: Json, routingKey: string): ModelRequest {
  if (!Array.isArray(body.messages)) throw new ModelEndpointError(400, 'invalid_request_error', 'messages: required array');
  const system: string[] = [];
  const messages: ModelMessage[] = [];
  const push = (role: 'user' | 'assistant', block: ContentBlock): void => {
    const last = messages.at(-1);
    if (last && last.role === role) last.content.push(block);
    else messages.push({ role, content: [block] });
  };
  const contentText = (c: unknown): string =>
    typeof c === 'string' ? c : Array.isArray(c) ? (c as Json[]).map((p) => (p.type === 'text' ? text(p.text) : '')).join('') : '';
  for (const m of body.messages as Json[]) {
    if (m.role === 'system' || m.role === 'developer') system.push(contentText(m.content));
    else if (m.role === 'user') push('user', { type: 'text', text: contentText(m.content) });
    else if (m.role === 'assistant') {
      const t = contentText(m.content);
      if (t) push('assistant', { type: 'text', text: t });
      for (const call of (Array.isArray(m.tool_calls) ? m.tool_calls : []) as Json[]) {
        const fn = (call.function ?? {}) as Json;
        let input: unknown = {};
        try {
          input = JSON.parse(text(fn.arguments) || '{}');
        } catch {
          input = { _raw: text(fn.arguments) };
        }
        push('assistant', { type: 'tool_use', id: text(call.id), name: text(fn.name), input });
      }
    } else if (m.role === 'tool') push('user', { type: 'tool_result', tool_use_id: text(m.tool_call_id), content: contentText(m.content) });
  }
  const tools: ToolSpec[] = Array.isArray(body.tools)
    ? (body.tools as Json[]).map((t) => (t.function ?? {}) as Json).filter((f) => typeof f.name === 'string').map((f) => ({
        name: text(f.name), description: text(f.description), input_schema: (f.parameters as Record<string, unknown> | undefined) ?? { type: 'object' },
      }))
    : [];
  const max = typeof body.max_completion_tokens === 'number' ? body.max_completion_tokens : body.max_tokens;
  return {
    routing_key: routingKey,
    ...(system.length > 0 ? { system: system.join('\n') } : {}),
    messages,
    tools,
    ...(typeof max === 'number' ? { max_output_tokens: max } : {}),
    ...(typeof body.temperature === 'number' ? { temperature: body.temperature } : {}),
  };
}

const ANTHROPIC_STOP: Record<StopReason, string> = { end_turn: 'end_turn', tool_use: 'tool_use', max_tokens: 'max_tokens', refusal: 'refusal', canceled: 'end_turn' };
const OPENAI_STOP: Record<StopReason, string> = { end_turn: 'stop', tool_use: 'tool_calls', max_tokens: 'length', refusal: 'content_filter', canceled: 'stop' };

/** The HTTP status a gateway error maps to (what the agent's SDK understands: retry on 429/5xx). */
function statusOf(type: string, retryable: boolean): number {
  if (type === 'policy.denied') return 403;
  // Agent SDKs retry 429 and 5xx; a spent budget or a malformed request must not be retried.
  if (!retryable) return 400;
  return type === 'model.platform_capacity_reached' ? 429 : 503;
}

let counter = 0;
const newId = (prefix: string): string => `${prefix}${Date.now().toString(36)}${(++counter).toString(36)}`;

/** Runs one step and writes it in the caller's wire format. */
class StepWriter {
  private usage: TokenUsage = { ...ZERO_USAGE };
  constructor(
    private readonly o: ModelEndpointOptions,
    private readonly res: ServerResponse,
    private readonly signal: AbortSignal,
  ) {}

  private async *events(request: ModelRequest): AsyncIterable<ModelStreamEvent> {
    const started = performance.now();
    let first: number | undefined;
    for await (const e of this.o.model.stream(request, this.signal)) {
      first ??= performance.now() - started;
      if (e.type === 'end' || e.type === 'error') this.o.onStep?.({ first_event_ms: first, total_ms: performance.now() - started });
      if (e.type === 'end') {
        this.usage = addUsage(this.usage, e.usage);
        this.o.onUsage?.(e.usage);
      }
      if (e.type === 'error') this.o.onError?.(e.error);
      yield e;
      if (e.type === 'end' || e.type === 'error') return;
    }
  }

  private sse(event: string | null, data: unknown): void {
    this.res.write(`${event ? `event: ${event}\n` : ''}data: ${JSON.stringify(data)}\n\n`);
  }

  private fail(status: number, body: unknown): void {
    if (!this.res.headersSent) {
      this.res.writeHead(status, { 'content-type': 'application/json' });
      this.res.end(JSON.stringify(body));
    } else this.res.end();
  }

  async anthropic(request: ModelRequest, stream: boolean, model: string): Promise<void> {
    const id = newId('msg_');
    if (!stream) {
      const content: Json[] = [];
      for await (const e of this.events(request)) {
        if (e.type === 'text_delta') {
          const last = content.at(-1);
          if (last?.type === 'text') last.text = text(last.text) + e.text;
          else content.push({ type: 'text', text: e.text });
        } else if (e.type === 'thinking_delta') {
          const last = content.at(-1);
          if (last?.type === 'thinking') last.thinking = text(last.thinking) + e.text;
          else content.push({ type: 'thinking', thinking: e.text, signature: '' });
        } else if (e.type === 'tool_use') content.push({ type: 'tool_use', id: e.id, name: e.name, input: e.input });
        else if (e.type === 'error') {
          return this.fail(statusOf(e.error.type, e.error.retryable), { type: 'error', error: { type: e.error.retryable ? 'overloaded_error' : 'api_error', message: e.error.message } });
        } else if (e.type === 'end') {
          this.res.writeHead(200, { 'content-type': 'application/json' });
          this.res.end(JSON.stringify({
            id, type: 'message', role: 'assistant', model, content, stop_reason: ANTHROPIC_STOP[e.stop_reason], stop_sequence: null,
            usage: { input_tokens: e.usage.input_tokens, output_tokens: e.usage.output_tokens, cache_read_input_tokens: e.usage.cached_input_tokens, cache_creation_input_tokens: e.usage.cache_write_input_tokens },
          }));
          return;
        }
      }
      return this.fail(502, { type: 'error', error: { type: 'api_error', message: 'the model stream ended without an end' } });
    }
    let started = false;
    let index = -1;
    let open: 'text' | 'thinking' | null = null;
    const start = (): void => {
      if (started) return;
      started = true;
      this.res.writeHead(200, { 'content-type': 'text/event-stream', 'cache-control': 'no-cache' });
      this.sse('message_start', { type: 'message_start', message: { id, type: 'message', role: 'assistant', model, content: [], stop_reason: null, stop_sequence: null, usage: { input_tokens: 0, output_tokens: 0 } } });
    };
    const close = (): void => {
      if (open) this.sse('content_block_stop', { type: 'content_block_stop', index });
      open = null;
    };
    for await (const e of this.events(request)) {
      if (e.type === 'error') {
        if (!started) return this.fail(statusOf(e.error.type, e.error.retryable), { type: 'error', error: { type: e.error.retryable ? 'overloaded_error' : 'api_error', message: e.error.message } });
        this.sse('error', { type: 'error', error: { type: 'api_error', message: e.error.message } });
        this.res.end();
        return;
      }
      start();
      if (e.type === 'text_delta' || e.type === 'thinking_delta') {
        const kind = e.type === 'text_delta' ? 'text' : 'thinking';
        if (open !== kind) {
          close();
          index += 1;
          open = kind;
          this.sse('content_block_start', { type: 'content_block_start', index, content_block: kind === 'text' ? { type: 'text', text: '' } : { type: 'thinking', thinking: '', signature: '' } });
        }
        this.sse('content_block_delta', { type: 'content_block_delta', index, delta: kind === 'text' ? { type: 'text_delta', text: e.text } : { type: 'thinking_delta', thinking: e.text } });
      } else if (e.type === 'tool_use') {
        close();
        index += 1;
        this.sse('content_block_start', { type: 'content_block_start', index, content_block: { type: 'tool_use', id: e.id, name: e.name, input: {} } });
        this.sse('content_block_delta', { type: 'content_block_delta', index, delta: { type: 'input_json_delta', partial_json: JSON.stringify(e.input ?? {}) } });
        this.sse('content_block_stop', { type: 'content_block_stop', index });
      } else if (e.type === 'end') {
        close();
        this.sse('message_delta', {
          type: 'message_delta', delta: { stop_reason: ANTHROPIC_STOP[e.stop_reason], stop_sequence: null },
          usage: { input_tokens: e.usage.input_tokens, output_tokens: e.usage.output_tokens, cache_read_input_tokens: e.usage.cached_input_tokens, cache_creation_input_tokens: e.usage.cache_write_input_tokens },
        });
        this.sse('message_stop', { type: 'message_stop' });
        this.res.end();
        return;
      }
    }
    if (!started) return this.fail(502, { type: 'error', error: { type: 'api_error', message: 'the model stream ended without an end' } });
    this.res.end();
  }

  async openai(request: ModelRequest, stream: boolean, model: string, includeUsage: boolean): Promise<void> {
    const id = newId('chatcmpl-');
    const created = Math.floor(Date.now() / 1000);
    const usageOf = (u: TokenUsage): Json => ({
      prompt_tokens: u.input_tokens, completion_tokens: u.output_tokens, total_tokens: u.input_tokens + u.output_tokens,
      prompt_tokens_details: { cached_tokens: u.cached_input_tokens },
    });
    const errorBody = (message: string): Json => ({ error: { message, type: 'server_error', code: null } });
    if (!stream) {
      let content = '';
      let reasoning = '';
      const calls: Json[] = [];
      for await (const e of this.events(request)) {
        if (e.type === 'text_delta') content += e.text;
        else if (e.type === 'thinking_delta') reasoning += e.text;
        else if (e.type === 'tool_use') calls.push({ id: e.id, type: 'function', function: { name: e.name, arguments: JSON.stringify(e.input ?? {}) } });
        else if (e.type === 'error') return this.fail(statusOf(e.error.type, e.error.retryable), errorBody(e.error.message));
        else if (e.type === 'end') {
          this.res.writeHead(200, { 'content-type': 'application/json' });
          this.res.end(JSON.stringify({
            id, object: 'chat.completion', created, model,
            choices: [{ index: 0, finish_reason: OPENAI_STOP[e.stop_reason], message: { role: 'assistant', content: content || null, ...(reasoning ? { reasoning_content: reasoning } : {}), ...(calls.length > 0 ? { tool_calls: calls } : {}) } }],
            usage: usageOf(e.usage),
          }));
          return;
        }
      }
      return this.fail(502, errorBody('the model stream ended without an end'));
    }
    let started = false;
    let calls = 0;
    const chunk = (delta: Json, finish: string | null): Json => ({ id, object: 'chat.completion.chunk', created, model, choices: [{ index: 0, delta, finish_reason: finish }] });
    const start = (): void => {
      if (started) return;
      started = true;
      this.res.writeHead(200, { 'content-type': 'text/event-stream', 'cache-control': 'no-cache' });
      this.sse(null, chunk({ role: 'assistant', content: '' }, null));
    };
    for await (const e of this.events(request)) {
      if (e.type === 'error') {
        if (!started) return this.fail(statusOf(e.error.type, e.error.retryable), errorBody(e.error.message));
        this.sse(null, errorBody(e.error.message));
        this.res.end();
        return;
      }
      start();
      if (e.type === 'text_delta') this.sse(null, chunk({ content: e.text }, null));
      else if (e.type === 'thinking_delta') this.sse(null, chunk({ reasoning_content: e.text }, null));
      else if (e.type === 'tool_use') {
        this.sse(null, chunk({ tool_calls: [{ index: calls++, id: e.id, type: 'function', function: { name: e.name, arguments: JSON.stringify(e.input ?? {}) } }] }, null));
      } else if (e.type === 'end') {
        this.sse(null, chunk({}, OPENAI_STOP[e.stop_reason]));
        if (includeUsage) this.sse(null, { id, object: 'chat.completion.chunk', created, model, choices: [], usage: usageOf(e.usage) });
        this.res.write('data: [DONE]\n\n');
        this.res.end();
        return;
      }
    }
    this.res.end();
  }
}

async function readBody(req: IncomingMessage): Promise<Json> {
  const chunks: Buffer[] = [];
  let size = 0;
  for await (const c of req as AsyncIterable<Buffer>) {
    size += c.length;
    if (size > MAX_BODY_BYTES) throw new ModelEndpointError(413, 'request_too_large', `the request body is larger than ${MAX_BODY_BYTES} bytes`);
    chunks.push(c);
  }
  try {
    const v: unknown = JSON.parse(Buffer.concat(chunks).toString('utf8'));
    if (!v || typeof v !== 'object' || Array.isArray(v)) throw new Error('not an object');
    return v as Json;
  } catch {
    throw new ModelEndpointError(400, 'invalid_request_error', 'the body is not a JSON object');
  }
}

function keyOf(req: IncomingMessage): string | undefined {
  const x = req.headers['x-api-key'];
  if (typeof x === 'string') return x;
  const auth = req.headers.authorization;
  return auth?.startsWith('Bearer ') ? auth.slice(7) : undefined;
}

/** Serves the endpoint on the runner's loopback; resolves with the server once it listens. */
export async function startModelEndpoint(o: ModelEndpointOptions): Promise<{ server: Server; port: number; close(): Promise<void> }> {
  const server = createServer((req, res) => {
    void handle(o, req, res).catch((err: unknown) => {
      const e = err instanceof ModelEndpointError ? err : new ModelEndpointError(500, 'api_error', err instanceof Error ? err.message : String(err));
      if (!res.headersSent) {
        res.writeHead(e.status, { 'content-type': 'application/json' });
        res.end(JSON.stringify({ type: 'error', error: { type: e.kind, message: e.message } }));
      } else res.end();
    });
  });
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(0, '127.0.0.1', () => resolve());
  });
  const port = (server.address() as AddressInfo).port;
  return {
    server,
    port,
    close: () => new Promise<void>((resolve) => {
      server.closeAllConnections();
      server.close(() => resolve());
    }),
  };
}

function withInstructions(r: ModelRequest, instructions: string | undefined): ModelRequest {
  if (!instructions) return r;
  return { ...r, system: r.system ? `${r.system}\n\n${instructions}` : instructions };
}

async function handle(o: ModelEndpointOptions, req: IncomingMessage, res: ServerResponse): Promise<void> {
  if (keyOf(req) !== o.key) throw new ModelEndpointError(401, 'authentication_error', 'invalid x-api-key');
  const path = (req.url ?? '/').split('?')[0] ?? '/';
  if (o.extra && (await o.extra(req, res))) return;
  const ac = new AbortController();
  res.on('close', () => ac.abort());
  const signal = AbortSignal.any([ac.signal, o.signal]);
  if (req.method === 'GET' && (path === '/v1/models' || path === '/models')) {
    res.writeHead(200, { 'content-type': 'application/json' });
    res.end(JSON.stringify({ object: 'list', data: [{ id: o.routingKey, type: 'model', object: 'model', display_name: o.routingKey, created_at: '1970-01-01T00:00:00Z' }] }));
    return;
  }
  if (req.method !== 'POST') throw new ModelEndpointError(404, 'not_found_error', `no route ${req.method ?? ''} ${path}`);
  if (path === '/v1/messages/count_tokens') {
    const body = await readBody(req);
    // A rough count (4 characters a token): agents use it only to decide when to compact.
    res.writeHead(200, { 'content-type': 'application/json' });
    res.end(JSON.stringify({ input_tokens: Math.ceil(JSON.stringify(body.messages ?? []).length / 4) }));
    return;
  }
  if (path === '/v1/messages') {
    const body = await readBody(req);
    await new StepWriter(o, res, signal).anthropic(withInstructions(fromAnthropic(body, o.routingKey), o.instructions), body.stream === true, text(body.model) || o.routingKey);
    return;
  }
  if (path === '/v1/chat/completions' || path === '/chat/completions') {
    const body = await readBody(req);
    const includeUsage = (body.stream_options as Json | undefined)?.include_usage === true;
    await new StepWriter(o, res, signal).openai(withInstructions(fromOpenAi(body, o.routingKey), o.instructions), body.stream === true, text(body.model) || o.routingKey, includeUsage);
    return;
  }
  throw new ModelEndpointError(404, 'not_found_error', `no route POST ${path}`);
}
