import { createServer, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { afterAll, describe, expect, it } from 'vitest';
import type { ModelRequest, ModelStreamEvent } from '@agentplane/protocol';
import { AnthropicMessagesAdapter } from './anthropic.js';
import { OpenAiChatAdapter } from './openai.js';

/**
 * A reply cut by the output limit while it was streaming tool calls: the step ends with the
 * `max_tokens` stop reason and none of the unfinished calls is handed on as a callable
 * `tool_use`, with both wire formats (served by a loopback server speaking each).
 */
const servers: Server[] = [];
afterAll(() => {
  for (const s of servers) {
    s.closeAllConnections();
    s.close();
  }
});

/** A loopback server answering every request with `chunks` as one event stream. */
function serve(chunks: string[]): Promise<string> {
  const s = createServer((req, res: ServerResponse) => {
    req.resume();
    req.on('end', () => {
      res.writeHead(200, { 'content-type': 'text/event-stream' });
      for (const c of chunks) res.write(c);
      res.end();
    });
  });
  servers.push(s);
  return new Promise((r) => s.listen(0, '127.0.0.1', () => r(`http://127.0.0.1:${(s.address() as AddressInfo).port}`)));
}

const request: ModelRequest = {
  routing_key: 'x',
  messages: [{ role: 'user', content: [{ type: 'text', text: 'What is the weather in Paris and Rome?' }] }],
  tools: [{ name: 'get_weather', description: 'Weather by city', input_schema: { type: 'object', properties: { city: { type: 'string' } } } }],
};

async function collect(events: AsyncIterable<ModelStreamEvent>): Promise<ModelStreamEvent[]> {
  const out: ModelStreamEvent[] = [];
  for await (const e of events) out.push(e);
  return out;
}

const oai = (o: unknown) => `data: ${JSON.stringify(o)}\n\n`;
const oaiCall = (index: number, fragment: { id?: string; name?: string; arguments: string }) =>
  oai({ model: 'm', choices: [{ index: 0, delta: { tool_calls: [{ index, ...(fragment.id ? { id: fragment.id, type: 'function' } : {}), function: { ...(fragment.name ? { name: fragment.name } : {}), arguments: fragment.arguments } }] }, finish_reason: null }] });
const oaiUsage = oai({ model: 'm', choices: [], usage: { prompt_tokens: 40, completion_tokens: 16, total_tokens: 56 } });
const openAi = async (chunks: string[]) => collect(new OpenAiChatAdapter().stream({ request, model: 'm', baseUrl: `${await serve(chunks)}/v1`, apiKey: null, timeoutMs: 10_000 }, new AbortController().signal));

const ant = (type: string, o: Record<string, unknown> = {}) => `event: ${type}\ndata: ${JSON.stringify({ type, ...o })}\n\n`;
const anthropic = async (chunks: string[]) => collect(new AnthropicMessagesAdapter().stream({ request, model: 'm', baseUrl: await serve(chunks), apiKey: 'k', timeoutMs: 10_000 }, new AbortController().signal));

describe('Chat Completions: finish_reason "length" while tool calls were streaming', () => {
  it('ends max_tokens with the usage, and yields no tool_use (neither the cut call nor the one finished before it)', async () => {
    const events = await openAi([
      oai({ model: 'm', choices: [{ index: 0, delta: { role: 'assistant', content: 'Looking both up. ' }, finish_reason: null }] }),
      oaiCall(0, { id: 'call_a', name: 'get_weather', arguments: '' }),
      oaiCall(0, { arguments: '{"city": "Paris"}' }),
      oaiCall(1, { id: 'call_b', name: 'get_weather', arguments: '' }),
      oaiCall(1, { arguments: '{"city": "Ro' }),
      oai({ model: 'm', choices: [{ index: 0, delta: {}, finish_reason: 'length' }] }),
      oaiUsage,
      'data: [DONE]\n\n',
    ]);
    expect(events.filter((e) => e.type === 'tool_use')).toEqual([]);
    expect(events).toEqual([
      { type: 'text_delta', text: 'Looking both up. ' },
      {
        type: 'end', stop_reason: 'max_tokens', provider: 'openai', model: 'm',
        usage: { input_tokens: 40, cached_input_tokens: 0, cache_write_input_tokens: 0, output_tokens: 16, reasoning_output_tokens: 0, total_tokens: 56 },
      },
    ]);
  });

  it('arguments that happen to parse are not taken for a finished call either', async () => {
    const events = await openAi([
      oaiCall(0, { id: 'call_a', name: 'get_weather', arguments: '{"city": "Paris"}' }),
      oai({ model: 'm', choices: [{ index: 0, delta: {}, finish_reason: 'length' }] }),
      'data: [DONE]\n\n',
    ]);
    expect(events).toEqual([expect.objectContaining({ type: 'end', stop_reason: 'max_tokens' })]);
  });

  it('finished tool calls still end tool_use', async () => {
    const events = await openAi([
      oaiCall(0, { id: 'call_a', name: 'get_weather', arguments: '{"city": "Paris"}' }),
      oai({ model: 'm', choices: [{ index: 0, delta: {}, finish_reason: 'tool_calls' }] }),
      'data: [DONE]\n\n',
    ]);
    expect(events).toEqual([
      { type: 'tool_use', id: 'call_a', name: 'get_weather', input: { city: 'Paris' } },
      expect.objectContaining({ type: 'end', stop_reason: 'tool_use' }),
    ]);
  });
});

describe('Anthropic Messages: stop_reason "max_tokens" inside a tool_use block', () => {
  const start = ant('message_start', { message: { model: 'm', usage: { input_tokens: 30, output_tokens: 1 } } });
  const toolBlock = (index: number, id: string, json: string[]) => [
    ant('content_block_start', { index, content_block: { type: 'tool_use', id, name: 'get_weather', input: {} } }),
    ...json.map((partial_json) => ant('content_block_delta', { index, delta: { type: 'input_json_delta', partial_json } })),
    ant('content_block_stop', { index }),
  ];

  it('ends max_tokens and yields no tool_use, though the cut block was closed with content_block_stop', async () => {
    const events = await anthropic([
      start,
      ant('content_block_start', { index: 0, content_block: { type: 'text', text: '' } }),
      ant('content_block_delta', { index: 0, delta: { type: 'text_delta', text: 'Looking both up.' } }),
      ant('content_block_stop', { index: 0 }),
      ...toolBlock(1, 'toolu_a', ['{"city": ', '"Paris"}']),
      ...toolBlock(2, 'toolu_b', ['{"city": "Ro']),
      ant('message_delta', { delta: { stop_reason: 'max_tokens', stop_sequence: null }, usage: { output_tokens: 16 } }),
      ant('message_stop'),
    ]);
    expect(events.filter((e) => e.type === 'tool_use')).toEqual([]);
    expect(events).toEqual([
      { type: 'text_delta', text: 'Looking both up.' },
      {
        type: 'end', stop_reason: 'max_tokens', provider: 'anthropic', model: 'm',
        usage: { input_tokens: 30, cached_input_tokens: 0, cache_write_input_tokens: 0, output_tokens: 16, reasoning_output_tokens: 0, total_tokens: 46 },
      },
    ]);
  });

  it('finished tool_use blocks are yielded in order before the end', async () => {
    const events = await anthropic([
      start,
      ...toolBlock(0, 'toolu_a', ['{"city": ', '"Paris"}']),
      ...toolBlock(1, 'toolu_b', ['{"city": "Rome"}']),
      ant('message_delta', { delta: { stop_reason: 'tool_use', stop_sequence: null }, usage: { output_tokens: 16 } }),
      ant('message_stop'),
    ]);
    expect(events).toEqual([
      { type: 'tool_use', id: 'toolu_a', name: 'get_weather', input: { city: 'Paris' } },
      { type: 'tool_use', id: 'toolu_b', name: 'get_weather', input: { city: 'Rome' } },
      expect.objectContaining({ type: 'end', stop_reason: 'tool_use' }),
    ]);
  });
});
