import { describe, expect, it } from 'vitest';
import type { ModelMessage } from '@agentplane/protocol';
import { checkSpecSize, cutText, fitHistory, fitResponses, SpecTooLarge } from './spec-budget.js';

const size = (v: unknown): number => Buffer.byteLength(JSON.stringify(v), 'utf8');
const user = (...texts: string[]): ModelMessage => ({ role: 'user', content: texts.map((text) => ({ type: 'text', text })) });
const assistant = (text: string): ModelMessage => ({ role: 'assistant', content: [{ type: 'text', text }] });

describe('a turn spec fitted to a runner frame', () => {
  it('cuts a text at a character boundary, to about its share, and says how much was left out', () => {
    for (const ch of ['a', '報', '😀', '"', '\n']) {
      const text = ch.repeat(100_000);
      const cut = cutText(text, 50_000, 'message');
      expect(size(cut)).toBeLessThanOrEqual(50_000);
      expect(size(cut)).toBeGreaterThan(40_000);
      expect(cut).not.toContain('\uFFFD');
      expect(cut).toMatch(/\[agentplane: the rest of this message \(\d+ of its \d+ bytes\) was cut so that the turn fits its size limit\]$/);
      expect(cut.startsWith(ch.repeat(100))).toBe(true);
    }
    expect(cutText('short', 50_000, 'message')).toBe('short');
  });

  it('a newest message heavier than the budget is cut to fit, each of its texts keeping a share', () => {
    const heavy = user(`first ${'a'.repeat(600_000)}`, '報'.repeat(600_000), 'a small last block');
    const [only, ...rest] = fitHistory([heavy], 512 * 1024);
    expect(rest).toEqual([]);
    expect(size(only)).toBeLessThanOrEqual(512 * 1024);
    const texts = only!.content.map((b) => (b.type === 'text' ? b.text : ''));
    expect(texts[0]!.startsWith('first aaa')).toBe(true);
    expect(texts[1]!.startsWith('報報報')).toBe(true);
    // A text under its share is kept whole.
    expect(texts[2]).toBe('a small last block');
    expect(texts.filter((x) => x.includes('was cut so that the turn fits'))).toHaveLength(2);
  });

  it('a newest message of thousands of parts keeps its newest parts whole, one note for the rest, within the budget', () => {
    // A turn that took thousands of queued messages: a share each would be only its note.
    const many = user(...Array.from({ length: 12_000 }, (_, i) => `part ${i} ${'x'.repeat(120)}`));
    const [only] = fitHistory([many], 512 * 1024);
    expect(size(only)).toBeLessThanOrEqual(512 * 1024);
    const texts = only!.content.map((b) => (b.type === 'text' ? b.text : ''));
    expect(texts[0]).toMatch(/^\[agentplane: the first \d+ parts of this message \(\d+ bytes\) were left out so that the turn fits its size limit\]$/);
    expect(texts.at(-1)).toBe(`part 11999 ${'x'.repeat(120)}`);
    expect(texts.filter((t) => t.includes('was cut so that'))).toEqual([]);
    const dropped = Number(/first (\d+) parts/.exec(texts[0]!)?.[1]);
    expect(dropped + texts.length - 1).toBe(12_000);
    // Its tool results are kept, cut short; a part that does not fit whole is cut to what is left.
    const mixed: ModelMessage = {
      role: 'user',
      content: [{ type: 'tool_result', tool_use_id: 'toolu_1', content: 'r'.repeat(400_000) }, ...Array.from({ length: 3_000 }, () => ({ type: 'text' as const, text: 'y'.repeat(300) })), { type: 'text', text: 'z'.repeat(600_000) }],
    };
    const [fit] = fitHistory([mixed], 512 * 1024);
    expect(size(fit)).toBeLessThanOrEqual(512 * 1024);
    expect(fit!.content[0]).toMatchObject({ type: 'tool_result', tool_use_id: 'toolu_1' });
    const last = fit!.content.at(-1);
    expect(last?.type === 'text' && last.text.startsWith('zzz') && last.text.includes('was cut so that the turn fits')).toBe(true);
  });

  it('older messages left out are named in the first message kept, after its tool results', () => {
    const history: ModelMessage[] = [user('x'.repeat(300_000)), assistant('y'.repeat(300_000)), user('hello'), assistant('hi'), user('again')];
    const kept = fitHistory(history, 512 * 1024);
    expect(kept.map((m) => m.role)).toEqual(['user', 'assistant', 'user']);
    expect(kept[0]!.content).toEqual([{ type: 'text', text: '[agentplane: the 2 earlier messages of this conversation were left out so that the turn fits its size limit]' }, { type: 'text', text: 'hello' }]);
    const withResult: ModelMessage[] = [user('x'.repeat(600_000)), { role: 'user', content: [{ type: 'tool_result', tool_use_id: 'toolu_1', content: 'ok' }] }];
    const [first] = fitHistory(withResult, 512 * 1024);
    expect(first!.content.map((b) => b.type)).toEqual(['tool_result', 'text']);
    // A conversation that fits is the conversation.
    expect(fitHistory(history.slice(2), 512 * 1024)).toEqual(history.slice(2));
  });

  it('answers together heavier than their budget share it', () => {
    const big = 'r'.repeat(600_000);
    const fitted = fitResponses({ custom_tool_results: { a: { content: big }, b: { content: 'small', is_error: true } }, confirmations: { c: 'allow' }, question_answers: { d: { content: big } } }, 256 * 1024);
    expect(size(fitted)).toBeLessThanOrEqual(256 * 1024 + 1024);
    expect(fitted.custom_tool_results.b).toEqual({ content: 'small', is_error: true });
    expect(fitted.confirmations).toEqual({ c: 'allow' });
    expect(fitted.custom_tool_results.a!.content).toContain('was cut so that the turn fits');
    expect(fitted.question_answers.d!.content).toContain('was cut so that the turn fits');
  });

  it('a spec heavier than a frame even so is refused, naming its size', () => {
    expect(() => checkSpecSize({ agent: { system: 's'.repeat(2_000_000) } })).toThrow(SpecTooLarge);
    expect(() => checkSpecSize({ agent: { system: 'brief' } })).not.toThrow();
  });
});
