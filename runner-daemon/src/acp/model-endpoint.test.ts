import { describe, expect, it } from 'vitest';
import type { ModelClient, ModelRequest, ModelStreamEvent } from '@agentplane/protocol';
import { fromAnthropic, fromOpenAi, startModelEndpoint } from './model-endpoint.js';

const USAGE = { input_tokens: 10, cached_input_tokens: 0, cache_write_input_tokens: 0, output_tokens: 5, reasoning_output_tokens: 0, total_tokens: 15 };

/** A model that records its requests and answers with a fixed stream. */
function fakeModel(events: ModelStreamEvent[]): { model: ModelClient; seen: ModelRequest[] } {
  const seen: ModelRequest[] = [];
  return {
    seen,
    model: {
      async *stream(request) {
        seen.push(request);
        for (const e of events) yield e;
      },
    },
  };
}

const TOOL_STEP: ModelStreamEvent[] = [
  { type: 'thinking_delta', text: 'hm' },
  { type: 'text_delta', text: 'Hel' },
  { type: 'text_delta', text: 'lo' },
  { type: 'tool_use', id: 'toolu_1', name: 'run', input: { command: 'ls' } },
  { type: 'end', stop_reason: 'tool_use', usage: USAGE, provider: 'scripted', model: 'scripted-1' },
];

async function withEndpoint<T>(events: ModelStreamEvent[], fn: (base: string, seen: ModelRequest[]) => Promise<T>): Promise<T> {
  const { model, seen } = fakeModel(events);
  const ep = await startModelEndpoint({ model, routingKey: 'default', key: 'ap-lease-k', signal: new AbortController().signal, instructions: 'PLATFORM RULES' });
  try {
    return await fn(`http://127.0.0.1:${ep.port}`, seen);
  } finally {
    await ep.close();
  }
}

describe('the ACP model endpoint', () => {
  it('translates Anthropic Messages requests, tool results included, and always uses the Run routing key', () => {
    const r = fromAnthropic({
      model: 'claude-whatever', max_tokens: 100, system: [{ type: 'text', text: 'sys' }],
      messages: [
        { role: 'user', content: 'hi' },
        { role: 'assistant', content: [{ type: 'text', text: 'ok' }, { type: 'tool_use', id: 't1', name: 'run', input: { a: 1 } }] },
        { role: 'user', content: [{ type: 'tool_result', tool_use_id: 't1', content: [{ type: 'text', text: 'out' }], is_error: true }] },
      ],
      tools: [{ name: 'run', description: 'd', input_schema: { type: 'object' } }],
    }, 'default');
    expect(r).toEqual({
      routing_key: 'default', system: 'sys', max_output_tokens: 100,
      messages: [
        { role: 'user', content: [{ type: 'text', text: 'hi' }] },
        { role: 'assistant', content: [{ type: 'text', text: 'ok' }, { type: 'tool_use', id: 't1', name: 'run', input: { a: 1 } }] },
        { role: 'user', content: [{ type: 'tool_result', tool_use_id: 't1', content: 'out', is_error: true }] },
      ],
      tools: [{ name: 'run', description: 'd', input_schema: { type: 'object' } }],
    });
  });

  it('translates OpenAI Chat Completions requests (system, tool calls, tool messages)', () => {
    const r = fromOpenAi({
      model: 'gpt-x', max_completion_tokens: 50,
      messages: [
        { role: 'system', content: 'sys' },
        { role: 'user', content: [{ type: 'text', text: 'hi' }] },
        { role: 'assistant', content: null, tool_calls: [{ id: 'c1', type: 'function', function: { name: 'run', arguments: '{"a":1}' } }] },
        { role: 'tool', tool_call_id: 'c1', content: 'out' },
      ],
      tools: [{ type: 'function', function: { name: 'run', description: 'd', parameters: { type: 'object' } } }],
    }, 'default');
    expect(r).toEqual({
      routing_key: 'default', system: 'sys', max_output_tokens: 50,
      messages: [
        { role: 'user', content: [{ type: 'text', text: 'hi' }] },
        { role: 'assistant', content: [{ type: 'tool_use', id: 'c1', name: 'run', input: { a: 1 } }] },
        { role: 'user', content: [{ type: 'tool_result', tool_use_id: 'c1', content: 'out' }] },
      ],
      tools: [{ name: 'run', description: 'd', input_schema: { type: 'object' } }],
    });
  });

  it('refuses a request without the lease placeholder key', async () => {
    await withEndpoint(TOOL_STEP, async (base, seen) => {
      const res = await fetch(`${base}/v1/messages`, { method: 'POST', headers: { 'x-api-key': 'sk-real' }, body: JSON.stringify({ messages: [] }) });
      expect(res.status).toBe(401);
      expect(seen).toHaveLength(0);
    });
  });

  it('streams Anthropic server-sent events and adds the Agent instructions to the system prompt', async () => {
    await withEndpoint(TOOL_STEP, async (base, seen) => {
      const res = await fetch(`${base}/v1/messages`, {
        method: 'POST', headers: { 'x-api-key': 'ap-lease-k', 'content-type': 'application/json' },
        body: JSON.stringify({ model: 'm', max_tokens: 10, stream: true, system: 'agent sys', messages: [{ role: 'user', content: 'hi' }] }),
      });
      expect(res.status).toBe(200);
      const events = (await res.text()).split('\n\n').filter(Boolean).map((f) => JSON.parse(f.split('\n')[1]!.slice(6)) as { type: string; [k: string]: unknown });
      expect(events.map((e) => e.type)).toEqual([
        'message_start', 'content_block_start', 'content_block_delta', 'content_block_stop', 'content_block_start', 'content_block_delta', 'content_block_delta',
        'content_block_stop', 'content_block_start', 'content_block_delta', 'content_block_stop', 'message_delta', 'message_stop',
      ]);
      expect(events[9]).toMatchObject({ delta: { type: 'input_json_delta', partial_json: '{"command":"ls"}' } });
      expect(events[11]).toMatchObject({ delta: { stop_reason: 'tool_use' }, usage: { input_tokens: 10, output_tokens: 5 } });
      expect(seen[0]?.system).toBe('agent sys\n\nPLATFORM RULES');
      expect(seen[0]?.routing_key).toBe('default');
    });
  });

  it('answers non-streaming OpenAI requests with tool calls and usage', async () => {
    await withEndpoint(TOOL_STEP, async (base) => {
      const res = await fetch(`${base}/v1/chat/completions`, {
        method: 'POST', headers: { authorization: 'Bearer ap-lease-k', 'content-type': 'application/json' },
        body: JSON.stringify({ model: 'm', messages: [{ role: 'user', content: 'hi' }] }),
      });
      const body = (await res.json()) as { choices: Array<{ finish_reason: string; message: { content: string; tool_calls: unknown[] } }>; usage: { total_tokens: number } };
      expect(body.choices[0]).toMatchObject({ finish_reason: 'tool_calls', message: { content: 'Hello', tool_calls: [{ id: 'toolu_1', type: 'function', function: { name: 'run', arguments: '{"command":"ls"}' } }] } });
      expect(body.usage.total_tokens).toBe(15);
    });
  });

  it('maps a spent budget before any output to a status the agent SDKs do not retry', async () => {
    await withEndpoint([{ type: 'error', error: { type: 'budget.exceeded', message: 'spent', retryable: false } }], async (base) => {
      const res = await fetch(`${base}/v1/messages`, {
        method: 'POST', headers: { 'x-api-key': 'ap-lease-k' }, body: JSON.stringify({ stream: true, messages: [{ role: 'user', content: 'hi' }] }),
      });
      expect(res.status).toBe(400);
      expect(await res.json()).toMatchObject({ type: 'error', error: { message: 'spent' } });
    });
  });
});
