import { describe, expect, it } from 'vitest';
import type { ModelStreamEvent } from '@agentplane/protocol';
import { ProviderError } from './errors.js';
import { ScriptedAdapter } from './scripted.js';

async function reply(rules: unknown[], user: string): Promise<string> {
  const system = `\`\`\`scripted\n${JSON.stringify({ rules })}\n\`\`\``;
  const call = { request: { routing_key: 'default', system, messages: [{ role: 'user' as const, content: [{ type: 'text' as const, text: user }] }], tools: [] }, model: 'scripted-1', baseUrl: null, apiKey: null };
  let text = '';
  for await (const e of new ScriptedAdapter().stream(call, new AbortController().signal) as AsyncGenerator<ModelStreamEvent>) if (e.type === 'text_delta') text += e.text;
  return text;
}

describe('scripted user_matches', () => {
  it('searches the user text with a regular expression', async () => {
    const rules = [{ when: { user_matches: '^(hi|hello)\\b' }, then: [{ reply: 'greeted' }] }, { then: [{ reply: 'other' }] }];
    expect(await reply(rules, 'hello there')).toBe('greeted');
    expect(await reply(rules, 'hix')).toBe('other');
  });

  it('matches in linear time: a catastrophic-backtracking pattern answers at once', async () => {
    // (a+)+$ against a long run of a's and a b takes a backtracking engine exponential time.
    const rules = [{ when: { user_matches: '(a+)+$' }, then: [{ reply: 'matched' }] }, { then: [{ reply: 'no match' }] }];
    const started = performance.now();
    expect(await reply(rules, `${'a'.repeat(5000)}b`)).toBe('no match');
    expect(performance.now() - started).toBeLessThan(1000);
  });

  it('a malformed expression is a non-retryable bad request', async () => {
    const err = await reply([{ when: { user_matches: '(' }, then: [{ reply: 'x' }] }], 'hi').catch((e: unknown) => e);
    expect(err).toBeInstanceOf(ProviderError);
    expect(err).toMatchObject({ kind: 'bad_request' });
  });
});

describe('scripted system_contains', () => {
  it('reads the system prompt the model receives, with what the harness appended', async () => {
    const rules = [{ when: { system_contains: '\u0023# Skills' }, then: [{ reply: 'has skills' }] }, { then: [{ reply: 'no skills' }] }];
    // The condition is written escaped in the script, so only the appended section matches it.
    const script = JSON.stringify({ rules }).replace('## Skills', '\\u0023# Skills');
    const run = async (system: string) => {
      const call = { request: { routing_key: 'default', system, messages: [{ role: 'user' as const, content: [{ type: 'text' as const, text: 'hi' }] }], tools: [] }, model: 'scripted-1', baseUrl: null, apiKey: null };
      let text = '';
      for await (const e of new ScriptedAdapter().stream(call, new AbortController().signal) as AsyncGenerator<ModelStreamEvent>) if (e.type === 'text_delta') text += e.text;
      return text;
    };
    expect(await run(`\`\`\`scripted\n${script}\n\`\`\``)).toBe('no skills');
    expect(await run(`\`\`\`scripted\n${script}\n\`\`\`\n\n## Skills\n- a: b`)).toBe('has skills');
  });
});

describe('scripted delegation helpers', () => {
  it('expands {{each_tool_result.<field>}} and {{tool_results}} from the last message\'s tool results', async () => {
    const rules = [
      { when: { on: 'tool_result', after_tool: 'start_thread' }, then: [{ tool: 'wait_threads', input: { session_thread_ids: '{{each_tool_result.session_thread_id}}' } }] },
      { when: { after_tool: 'wait_threads' }, then: [{ reply: 'all: {{tool_results}}' }] },
    ];
    const system = `\`\`\`scripted\n${JSON.stringify({ rules })}\n\`\`\``;
    const messages = [
      { role: 'user' as const, content: [{ type: 'text' as const, text: 'go' }] },
      { role: 'assistant' as const, content: [{ type: 'tool_use' as const, id: 'toolu_a', name: 'start_thread', input: {} }, { type: 'tool_use' as const, id: 'toolu_b', name: 'start_thread', input: {} }] },
      { role: 'user' as const, content: [
        { type: 'tool_result' as const, tool_use_id: 'toolu_a', content: '{"session_thread_id":"sthr_1"}' },
        { type: 'tool_result' as const, tool_use_id: 'toolu_b', content: 'not json' },
        { type: 'tool_result' as const, tool_use_id: 'toolu_b', content: '{"session_thread_id":"sthr_2"}' },
      ] },
    ];
    const call = { request: { routing_key: 'default', system, messages, tools: [] }, model: 'scripted-1', baseUrl: null, apiKey: null };
    const uses: unknown[] = [];
    for await (const e of new ScriptedAdapter().stream(call, new AbortController().signal) as AsyncGenerator<ModelStreamEvent>) if (e.type === 'tool_use') uses.push(e.input);
    expect(uses).toEqual([{ session_thread_ids: ['sthr_1', 'sthr_2'] }]);
  });
});
