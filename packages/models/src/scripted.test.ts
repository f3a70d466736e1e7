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
