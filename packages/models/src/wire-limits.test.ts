import { createServer, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { afterAll, describe, expect, it } from 'vitest';
import type { ModelRequest, ModelStreamEvent } from '@agentplane/protocol';
import { AnthropicMessagesAdapter } from './anthropic.js';
import { ProviderError } from './errors.js';
import { TOOL_CALLS_MAX_CHARS } from './http.js';
import { OpenAiChatAdapter } from './openai.js';
import { ScriptedAdapter } from './scripted.js';
import { SSE_MESSAGE_MAX_CHARS } from './sse.js';

/**
 * What the adapters make of awkward provider streams: events and tool calls larger than the
 * limits, tool-call fragments that repeat the name or leave out the index, stream errors, and
 * the step deadline of a scripted call.
 */
const servers: Server[] = [];
afterAll(() => {
  for (const s of servers) {
    s.closeAllConnections();
    s.close();
  }
});

/** A loopback server answering every request with `handle` (the request body is read first). */
function serve(handle: (res: ServerResponse) => void): Promise<string> {
  const s = createServer((req, res) => {
    req.resume();
    req.on('end', () => handle(res));
  });
  servers.push(s);
  return new Promise((r) => s.listen(0, '127.0.0.1', () => r(`http://127.0.0.1:${(s.address() as AddressInfo).port}`)));
}

const request: ModelRequest = { routing_key: 'x', messages: [{ role: 'user', content: [{ type: 'text', text: 'hi' }] }], tools: [] };
const oai = (o: unknown) => `data: ${JSON.stringify(o)}\n\n`;
const ant = (type: string, o: Record<string, unknown> = {}) => `event: ${type}\ndata: ${JSON.stringify({ type, ...o })}\n\n`;
const OAI_FINISH = (reason: string) => oai({ choices: [{ delta: {}, finish_reason: reason }] }) + 'data: [DONE]\n\n';

/** The events of one call, or the ProviderError it failed with. */
async function run(events: AsyncIterable<ModelStreamEvent>): Promise<ModelStreamEvent[] | ProviderError> {
  const out: ModelStreamEvent[] = [];
  try {
    for await (const e of events) out.push(e);
  } catch (err) {
    if (ProviderError.is(err)) return err;
    throw err;
  }
  return out;
}

const openAi = (baseUrl: string) => run(new OpenAiChatAdapter().stream({ request, model: 'm', baseUrl: `${baseUrl}/v1`, apiKey: null, timeoutMs: 30_000 }, new AbortController().signal));
const anthropic = (baseUrl: string) => run(new AnthropicMessagesAdapter().stream({ request, model: 'm', baseUrl, apiKey: 'k', timeoutMs: 30_000 }, new AbortController().signal));

describe('sizes: a provider cannot make the gateway buffer without bound', () => {
  it('one stream event larger than the limit fails the call (bad_request) instead of being buffered whole', async () => {
    const url = await serve((res) => {
      res.writeHead(200, { 'content-type': 'text/event-stream' });
      res.write('data: {"choices":[{"delta":{"content":"');
      const piece = 'x'.repeat(64 * 1024);
      for (let sent = 0; sent <= 2 * SSE_MESSAGE_MAX_CHARS; sent += piece.length) res.write(piece);
      res.end(`"}}]}\n\n${OAI_FINISH('stop')}`);
    });
    const r = await openAi(url);
    expect(r).toBeInstanceOf(ProviderError);
    expect((r as ProviderError).kind).toBe('bad_request');
  }, 60_000);

  it('events of any number, each under the limit, still stream (the limit is per event)', async () => {
    const url = await serve((res) => {
      res.writeHead(200, { 'content-type': 'text/event-stream' });
      const chunk = oai({ choices: [{ delta: { content: 'y'.repeat(16 * 1024) } }] });
      let all = '';
      while (all.length <= 2 * SSE_MESSAGE_MAX_CHARS) all += chunk;
      res.end(all + OAI_FINISH('stop'));
    });
    const r = await openAi(url);
    expect(Array.isArray(r)).toBe(true);
    expect((r as ModelStreamEvent[]).at(-1)).toMatchObject({ type: 'end', stop_reason: 'end_turn' });
  }, 60_000);

  it('streamed tool-call arguments beyond the limit fail the call (Chat Completions)', async () => {
    const url = await serve((res) => {
      res.writeHead(200, { 'content-type': 'text/event-stream' });
      res.write(oai({ choices: [{ delta: { tool_calls: [{ index: 0, id: 'call_1', type: 'function', function: { name: 'write', arguments: '{"text":"' } }] } }] }));
      const fragment = oai({ choices: [{ delta: { tool_calls: [{ index: 0, function: { arguments: 'z'.repeat(64 * 1024) } }] } }] });
      for (let sent = 0; sent <= TOOL_CALLS_MAX_CHARS; sent += 64 * 1024) res.write(fragment);
      res.end(oai({ choices: [{ delta: { tool_calls: [{ index: 0, function: { arguments: '"}' } }] } }] }) + OAI_FINISH('tool_calls'));
    });
    const r = await openAi(url);
    expect(r).toBeInstanceOf(ProviderError);
    expect((r as ProviderError).kind).toBe('bad_request');
  }, 60_000);

  it('streamed tool input beyond the limit fails the call (Anthropic input_json_delta)', async () => {
    const url = await serve((res) => {
      res.writeHead(200, { 'content-type': 'text/event-stream' });
      res.write(ant('message_start', { message: { model: 'm', usage: { input_tokens: 1, output_tokens: 1 } } }));
      res.write(ant('content_block_start', { index: 0, content_block: { type: 'tool_use', id: 'toolu_1', name: 'write', input: {} } }));
      const fragment = ant('content_block_delta', { index: 0, delta: { type: 'input_json_delta', partial_json: 'z'.repeat(64 * 1024) } });
      for (let sent = 0; sent <= TOOL_CALLS_MAX_CHARS; sent += 64 * 1024) res.write(fragment);
      res.end(ant('content_block_stop', { index: 0 }) + ant('message_delta', { delta: { stop_reason: 'tool_use' }, usage: { output_tokens: 5 } }) + ant('message_stop'));
    });
    const r = await anthropic(url);
    expect(r).toBeInstanceOf(ProviderError);
    expect((r as ProviderError).kind).toBe('bad_request');
  }, 60_000);
});

describe('health probes', () => {
  it('a model list that never ends is read only so far: the probe fails at once (bad_request), not at its timeout', async () => {
    const url = await serve((res) => {
      res.writeHead(200, { 'content-type': 'application/json' });
      res.write('{"data":[');
      const piece = `${JSON.stringify({ id: 'm'.repeat(1000) })},`.repeat(64);
      const more = (): void => {
        while (!res.destroyed && res.write(piece));
        if (!res.destroyed) res.once('drain', more);
      };
      more();
    });
    const r = await new OpenAiChatAdapter().probe({ baseUrl: `${url}/v1`, apiKey: null }, new AbortController().signal).then(() => null, (err: unknown) => err);
    expect(r).toBeInstanceOf(ProviderError);
    expect((r as ProviderError).kind).toBe('bad_request');
  }, 60_000);
});

describe('Chat Completions tool-call fragments', () => {
  it('a server that repeats the function name in every fragment yields the name once', async () => {
    const url = await serve((res) => {
      res.writeHead(200, { 'content-type': 'text/event-stream' });
      const frag = (args: string) => oai({ choices: [{ delta: { tool_calls: [{ index: 0, id: 'call_1', type: 'function', function: { name: 'get_weather', arguments: args } }] } }] });
      res.end(frag('') + frag('{"city":') + frag('"Paris"}') + OAI_FINISH('tool_calls'));
    });
    const r = await openAi(url);
    expect(r).toEqual([
      { type: 'tool_use', id: 'call_1', name: 'get_weather', input: { city: 'Paris' } },
      expect.objectContaining({ type: 'end', stop_reason: 'tool_use' }),
    ]);
  });

  it('calls sent whole without an index are separate calls, each with its own id', async () => {
    const url = await serve((res) => {
      res.writeHead(200, { 'content-type': 'text/event-stream' });
      const call = (id: string, city: string) => oai({ choices: [{ delta: { tool_calls: [{ id, type: 'function', function: { name: 'get_weather', arguments: JSON.stringify({ city }) } }] } }] });
      res.end(call('call_a', 'Paris') + call('call_b', 'Rome') + OAI_FINISH('tool_calls'));
    });
    const r = await openAi(url);
    expect(r).toEqual([
      { type: 'tool_use', id: 'call_a', name: 'get_weather', input: { city: 'Paris' } },
      { type: 'tool_use', id: 'call_b', name: 'get_weather', input: { city: 'Rome' } },
      expect.objectContaining({ type: 'end', stop_reason: 'tool_use' }),
    ]);
  });
});

describe('Anthropic stream error events are classified as their HTTP statuses are', () => {
  it.each([
    ['permission_error', 'auth'],
    ['authentication_error', 'auth'],
    ['not_found_error', 'bad_request'],
    ['request_too_large', 'bad_request'],
    ['invalid_request_error', 'bad_request'],
    ['rate_limit_error', 'rate_limited'],
    ['overloaded_error', 'server'],
    ['api_error', 'server'],
  ])('%s → %s', async (type, kind) => {
    const url = await serve((res) => {
      res.writeHead(200, { 'content-type': 'text/event-stream' });
      res.end(ant('message_start', { message: { model: 'm', usage: { input_tokens: 1, output_tokens: 1 } } }) + ant('error', { error: { type, message: 'no' } }));
    });
    const r = await anthropic(url);
    expect(r).toBeInstanceOf(ProviderError);
    expect((r as ProviderError).kind).toBe(kind);
  });
});

describe('the scripted provider', () => {
  const scripted = (rules: unknown, deadlineMs?: number) => run(new ScriptedAdapter().stream({
    request: { ...request, system: '```scripted\n' + JSON.stringify({ rules }) + '\n```' }, model: 'scripted-1', baseUrl: null, apiKey: null,
    ...(deadlineMs !== undefined ? { deadlineMs } : {}),
  }, new AbortController().signal));

  it('a sleep longer than the step deadline ends at the deadline as a timeout', async () => {
    const started = performance.now();
    const r = await scripted([{ then: [{ reply: 'a' }, { sleep_ms: 600_000 }, { reply: 'b' }] }], 300);
    expect(r).toBeInstanceOf(ProviderError);
    expect((r as ProviderError).kind).toBe('timeout');
    expect(performance.now() - started).toBeLessThan(30_000);
  }, 60_000);

  it('a malformed step is a bad_request, not an unexpected failure', async () => {
    for (const step of [null, 5, { reply: 5 }, { sleep_ms: 'long' }, { fail: 'teapot' }, { tool: 7 }, { wave: 'hello' }]) {
      const r = await scripted([{ then: [step] }]);
      expect(r, JSON.stringify(step)).toBeInstanceOf(ProviderError);
      expect((r as ProviderError).kind).toBe('bad_request');
    }
  });
});

describe('types: a provider cannot put values of another type into events or usage', () => {
  it('OpenAI: usage counts that are not counts are 0, text and names that are not strings are left out, odd chunks do not throw', async () => {
    const url = await serve((res) => {
      res.writeHead(200, { 'content-type': 'text/event-stream' });
      res.end(
        oai({ model: { evil: 1 }, choices: [{ delta: { content: 5, tool_calls: 5 } }] })
        + oai({ choices: [{ delta: { tool_calls: [null, { index: 0, id: 'call_1', function: { name: { x: 1 }, arguments: '{}' } }] } }] })
        + oai({ choices: [{ delta: { tool_calls: [{ index: 0, function: { name: 'bash' } }] } }] })
        + oai({ choices: [{ delta: { content: 'ok' }, finish_reason: 'tool_calls' }], usage: { prompt_tokens: 'n/a', completion_tokens: 1.5, total_tokens: -4, prompt_tokens_details: { cached_tokens: 50 } } })
        + 'data: [DONE]\n\n');
    });
    const events = await openAi(url);
    expect(events).not.toBeInstanceOf(ProviderError);
    const list = events as ModelStreamEvent[];
    expect(list.filter((e) => e.type === 'text_delta')).toEqual([{ type: 'text_delta', text: 'ok' }]);
    const end = list.at(-1);
    expect(end).toMatchObject({ type: 'end', model: 'm', usage: { input_tokens: 0, cached_input_tokens: 0, output_tokens: 0, total_tokens: 0 } });
    expect(list.filter((e) => e.type === 'tool_use')).toEqual([{ type: 'tool_use', id: 'call_1', name: 'bash', input: {} }]);
  });

  it('Anthropic: usage counts that are not counts are 0, text that is not a string is left out', async () => {
    const url = await serve((res) => {
      res.writeHead(200, { 'content-type': 'text/event-stream' });
      res.end(
        ant('message_start', { message: { model: { evil: 1 }, usage: { input_tokens: 'zz', output_tokens: 0 } } })
        + ant('content_block_start', { index: 0, content_block: { type: 'text', text: '' } })
        + ant('content_block_delta', { index: 0, delta: { type: 'text_delta', text: { a: 1 } } })
        + ant('content_block_delta', { index: 0, delta: { type: 'text_delta', text: 'fine' } })
        + ant('content_block_stop', { index: 0 })
        + ant('message_delta', { delta: { stop_reason: 'end_turn' }, usage: { output_tokens: -7 } })
        + ant('message_stop'));
    });
    const events = await anthropic(url);
    expect(events).not.toBeInstanceOf(ProviderError);
    const list = events as ModelStreamEvent[];
    expect(list.filter((e) => e.type === 'text_delta')).toEqual([{ type: 'text_delta', text: 'fine' }]);
    expect(list.at(-1)).toMatchObject({ type: 'end', model: 'm', usage: { input_tokens: 0, output_tokens: 0, total_tokens: 0 } });
  });
});
