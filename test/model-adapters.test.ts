import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { ModelRequest, ModelStreamEvent } from '@agentplane/protocol';
import {
  AnthropicMessagesAdapter, OpenAiChatAdapter, ProviderError, ScriptedAdapter, SHIPPED_PRICES, findPrice, listCostNanoUsd,
  type ProviderAdapter, type ProviderCall,
} from '@agentplane/models';
import { startAnthropicServer, startOpenAiServer, type ProviderServer } from './fixtures/provider-servers.js';

const request: ModelRequest = {
  routing_key: 'default',
  system: 'Be brief.',
  messages: [{ role: 'user', content: [{ type: 'text', text: 'What is the weather in Paris?' }] }],
  tools: [{ name: 'get_weather', description: 'Weather by city', input_schema: { type: 'object', properties: { city: { type: 'string' } } } }],
};

async function collect(adapter: ProviderAdapter, call: ProviderCall, signal = new AbortController().signal): Promise<ModelStreamEvent[]> {
  const out: ModelStreamEvent[] = [];
  for await (const e of adapter.stream(call, signal)) out.push(e);
  return out;
}

async function failure(p: Promise<unknown>): Promise<ProviderError> {
  try {
    await p;
  } catch (err) {
    if (ProviderError.is(err)) return err;
    throw err;
  }
  throw new Error('expected a ProviderError');
}

const text = (events: ModelStreamEvent[]) => events.flatMap((e) => (e.type === 'text_delta' ? [e.text] : [])).join('');

describe('OpenAI-compatible Chat Completions adapter against a local wire-format server', () => {
  let s: ProviderServer;
  const adapter = new OpenAiChatAdapter();
  beforeAll(async () => {
    s = await startOpenAiServer({ apiKey: 'sk-local-secret' });
  });
  afterAll(() => s.close());
  const call = (): ProviderCall => ({ request, model: 'gpt-4.1-mini', baseUrl: s.url, apiKey: 'sk-local-secret', timeoutMs: 2000 });

  it('streams text in several deltas and reports usage with cached and reasoning tokens', async () => {
    s.behavior = { ...s.behavior, mode: 'text', text: 'It is sunny in Paris today.' };
    const events = await collect(adapter, call());
    expect(events.filter((e) => e.type === 'text_delta').length).toBe(6);
    expect(text(events)).toBe('It is sunny in Paris today.');
    const end = events.at(-1);
    expect(end).toMatchObject({ type: 'end', stop_reason: 'end_turn', provider: 'openai', model: 'gpt-4.1-mini' });
    if (end?.type !== 'end') throw new Error('no end');
    expect(end.usage.cached_input_tokens).toBe(7);
    expect(end.usage.reasoning_output_tokens).toBe(5);
    expect(end.usage.output_tokens).toBe(11);
    expect(end.usage.total_tokens).toBe(end.usage.input_tokens + end.usage.output_tokens);
    const sent = s.requests.at(-1);
    expect(sent?.headers.authorization).toBe('Bearer sk-local-secret');
    expect(sent?.body).toMatchObject({ model: 'gpt-4.1-mini', stream: true, stream_options: { include_usage: true } });
    expect((sent?.body.messages as unknown[])[0]).toEqual({ role: 'system', content: 'Be brief.' });
    expect((sent?.body.tools as { function: { name: string } }[])[0]?.function.name).toBe('get_weather');
  });

  it('assembles streamed tool-call argument fragments into complete tool calls', async () => {
    s.behavior = { ...s.behavior, mode: 'tool' };
    const events = await collect(adapter, call());
    expect(events.filter((e) => e.type === 'tool_use')).toEqual([
      { type: 'tool_use', id: 'call_a1', name: 'get_weather', input: { city: 'Paris', unit: 'c' } },
      { type: 'tool_use', id: 'call_b2', name: 'get_time', input: { tz: 'Europe/Paris' } },
    ]);
    expect(events.find((e) => e.type === 'thinking_delta')).toEqual({ type: 'thinking_delta', text: 'Need the weather. ' });
    expect(events.at(-1)).toMatchObject({ type: 'end', stop_reason: 'tool_use' });
  });

  it('sends tool results back as tool messages after the assistant tool call', async () => {
    s.behavior = { ...s.behavior, mode: 'text', text: 'Done.' };
    await collect(adapter, {
      ...call(),
      request: {
        ...request,
        messages: [
          ...request.messages,
          { role: 'assistant', content: [{ type: 'tool_use', id: 'call_a1', name: 'get_weather', input: { city: 'Paris' } }] },
          { role: 'user', content: [{ type: 'tool_result', tool_use_id: 'call_a1', content: '21C' }] },
        ],
      },
    });
    const msgs = s.requests.at(-1)?.body.messages as Record<string, unknown>[];
    expect(msgs.slice(2)).toEqual([
      { role: 'assistant', content: null, tool_calls: [{ id: 'call_a1', type: 'function', function: { name: 'get_weather', arguments: '{"city":"Paris"}' } }] },
      { role: 'tool', tool_call_id: 'call_a1', content: '21C' },
    ]);
  });

  it('429 is retryable and carries Retry-After', async () => {
    s.behavior = { ...s.behavior, mode: 'rate_limit', retryAfter: '7' };
    const err = await failure(collect(adapter, call()));
    expect(err.kind).toBe('rate_limited');
    expect(err.retryable).toBe(true);
    expect(err.status).toBe(429);
    expect(err.retryAfterSeconds).toBe(7);
  });

  it('5xx is retryable; 401 is not', async () => {
    s.behavior = { ...s.behavior, mode: 'server_error' };
    const e5 = await failure(collect(adapter, call()));
    expect([e5.kind, e5.retryable, e5.status]).toEqual(['server', true, 503]);
    s.behavior = { ...s.behavior, mode: 'text' };
    const e4 = await failure(collect(adapter, { ...call(), apiKey: 'sk-wrong-one' }));
    expect([e4.kind, e4.retryable, e4.status]).toEqual(['auth', false, 401]);
  });

  it('a stalled server is a retryable timeout', async () => {
    s.behavior = { ...s.behavior, mode: 'hang' };
    const err = await failure(collect(adapter, { ...call(), timeoutMs: 300 }));
    expect([err.kind, err.retryable]).toEqual(['timeout', true]);
  });

  it('an unreachable server is a retryable network failure', async () => {
    const err = await failure(collect(adapter, { ...call(), baseUrl: 'http://127.0.0.1:9/v1' }));
    expect([err.kind, err.retryable]).toEqual(['network', true]);
  });

  it('aborting the step closes the provider HTTP stream', async () => {
    s.behavior = { ...s.behavior, mode: 'text', text: 'one two three four five six seven eight nine ten', chunkDelayMs: 100 };
    const before = s.aborted;
    const ctl = new AbortController();
    const seen: ModelStreamEvent[] = [];
    const err = await failure((async () => {
      for await (const e of adapter.stream(call(), ctl.signal)) {
        seen.push(e);
        if (seen.length === 2) ctl.abort();
      }
    })());
    expect(err.kind).toBe('canceled');
    expect(seen.length).toBe(2);
    await expect.poll(() => s.aborted, { timeout: 3000 }).toBe(before + 1);
    s.behavior = { ...s.behavior, chunkDelayMs: 0 };
  });

  it('probe lists models (health check)', async () => {
    await adapter.probe({ baseUrl: s.url, apiKey: 'sk-local-secret' }, new AbortController().signal);
    const err = await failure(adapter.probe({ baseUrl: s.url, apiKey: 'nope' }, new AbortController().signal));
    expect(err.kind).toBe('auth');
  });
});

describe('Anthropic Messages adapter against a local wire-format server', () => {
  let s: ProviderServer;
  const adapter = new AnthropicMessagesAdapter();
  beforeAll(async () => {
    s = await startAnthropicServer({ apiKey: 'sk-ant-local' });
  });
  afterAll(() => s.close());
  const call = (): ProviderCall => ({ request, model: 'claude-sonnet-4-5', baseUrl: s.url, apiKey: 'sk-ant-local', timeoutMs: 2000 });

  it('streams text deltas and normalises usage (cache reads and writes are part of input)', async () => {
    s.behavior = { ...s.behavior, mode: 'text', text: 'Sunny and mild.' };
    const events = await collect(adapter, call());
    expect(text(events)).toBe('Sunny and mild.');
    expect(events.filter((e) => e.type === 'text_delta').length).toBe(3);
    expect(events.at(-1)).toEqual({
      type: 'end', stop_reason: 'end_turn', provider: 'anthropic', model: 'claude-sonnet-4-5',
      usage: { input_tokens: 33, cached_input_tokens: 10, cache_write_input_tokens: 3, output_tokens: 3, reasoning_output_tokens: 0, total_tokens: 36 },
    });
    const sent = s.requests.at(-1);
    expect(sent?.headers['x-api-key']).toBe('sk-ant-local');
    expect(sent?.headers['anthropic-version']).toBe('2023-06-01');
    expect(sent?.body).toMatchObject({ model: 'claude-sonnet-4-5', system: 'Be brief.', stream: true, max_tokens: 4096 });
  });

  it('thinking, text and a tool_use assembled from input_json_delta', async () => {
    s.behavior = { ...s.behavior, mode: 'tool' };
    const events = await collect(adapter, call());
    expect(events.filter((e) => e.type === 'thinking_delta').map((e) => (e as { text: string }).text).join('')).toBe('Need the weather.');
    expect(text(events)).toBe('Checking.');
    expect(events.filter((e) => e.type === 'tool_use')).toEqual([{ type: 'tool_use', id: 'toolu_local1', name: 'get_weather', input: { city: 'Paris' } }]);
    expect(events.at(-1)).toMatchObject({ type: 'end', stop_reason: 'tool_use', usage: { output_tokens: 30 } });
  });

  it('429 with retry-after, 5xx retryable, 401 not', async () => {
    s.behavior = { ...s.behavior, mode: 'rate_limit', retryAfter: '3' };
    const e1 = await failure(collect(adapter, call()));
    expect([e1.kind, e1.retryable, e1.retryAfterSeconds]).toEqual(['rate_limited', true, 3]);
    s.behavior = { ...s.behavior, mode: 'server_error' };
    const e2 = await failure(collect(adapter, call()));
    expect([e2.kind, e2.retryable]).toEqual(['server', true]);
    s.behavior = { ...s.behavior, mode: 'text' };
    const e3 = await failure(collect(adapter, { ...call(), apiKey: 'bad' }));
    expect([e3.kind, e3.retryable]).toEqual(['auth', false]);
  });

  it('cancellation reaches the provider', async () => {
    s.behavior = { ...s.behavior, mode: 'text', text: 'a b c d e f g h i j k l', chunkDelayMs: 100 };
    const before = s.aborted;
    const ctl = new AbortController();
    setTimeout(() => ctl.abort(), 250);
    const err = await failure(collect(adapter, call(), ctl.signal));
    expect(err.kind).toBe('canceled');
    await expect.poll(() => s.aborted, { timeout: 3000 }).toBe(before + 1);
  });
});

describe('scripted provider', () => {
  const adapter = new ScriptedAdapter();
  const system = [
    'You are a test agent.',
    '```scripted',
    JSON.stringify({
      rules: [
        { when: { user_contains: 'weather' }, then: [{ think: 'I should call the tool.' }, { tool: 'get_weather', input: { city: 'Paris', asked: '{{user}}' } }] },
        { when: { after_tool: 'get_weather' }, then: [{ reply: 'The weather is {{tool_result}}.' }] },
        { when: { user_contains: 'busy' }, then: [{ fail: 'rate_limited', retry_after: 4 }] },
      ],
    }),
    '```',
  ].join('\n');
  const call = (messages: ModelRequest['messages']): ProviderCall => ({ request: { ...request, system, messages }, model: '', baseUrl: null, apiKey: null });

  it('follows the rules: think + tool call, then a reply built from the tool result', async () => {
    const first = await collect(adapter, call(request.messages));
    const tool = first.find((e) => e.type === 'tool_use');
    expect(tool).toMatchObject({ name: 'get_weather', input: { city: 'Paris', asked: 'What is the weather in Paris?' } });
    expect(first.at(-1)).toMatchObject({ type: 'end', stop_reason: 'tool_use', provider: 'scripted', model: 'scripted-1' });
    if (tool?.type !== 'tool_use') throw new Error('no tool');
    const second = await collect(adapter, call([
      ...request.messages,
      { role: 'assistant', content: [{ type: 'tool_use', id: tool.id, name: tool.name, input: tool.input }] },
      { role: 'user', content: [{ type: 'tool_result', tool_use_id: tool.id, content: 'sunny, 21C' }] },
    ]));
    expect(text(second)).toBe('The weather is sunny, 21C.');
    expect(second.filter((e) => e.type === 'text_delta').length).toBe(5);
    // Deterministic: the same request gives the same events.
    expect(await collect(adapter, call(request.messages))).toEqual(first);
  });

  it('echoes without a matching rule, and can simulate a provider 429', async () => {
    const echo = await collect(adapter, call([{ role: 'user', content: [{ type: 'text', text: 'hi there' }] }]));
    expect(text(echo)).toBe('You said: hi there');
    const err = await failure(collect(adapter, call([{ role: 'user', content: [{ type: 'text', text: 'busy?' }] }])));
    expect([err.kind, err.retryable, err.retryAfterSeconds]).toEqual(['rate_limited', true, 4]);
  });
});

describe('price table', () => {
  it('prices by exact name or longest prefix, with cached input at its own rate', () => {
    const p = findPrice(SHIPPED_PRICES, 'openai', 'gpt-4.1-mini-2025-04-14');
    expect(p).toMatchObject({ input: 0.4, output: 1.6 });
    const usage = { input_tokens: 1_000_000, cached_input_tokens: 500_000, cache_write_input_tokens: 0, output_tokens: 1_000_000, reasoning_output_tokens: 0, total_tokens: 2_000_000 };
    // 0.5M fresh at 0.4 + 0.5M cached at 0.1 + 1M out at 1.6 = 0.2 + 0.05 + 1.6 USD
    expect(listCostNanoUsd(p!, usage)).toBe(1_850_000_000);
    expect(findPrice(SHIPPED_PRICES, 'openai', 'llama3.1:8b')).toBeNull();
  });
});
