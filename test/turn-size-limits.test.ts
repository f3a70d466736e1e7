import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { idleCount, SCRIPT, startTurnPlatform, untilEvents, type TurnEvent, type TurnPlatform } from './harness/turns.js';

/**
 * A drive event may carry up to 4 MiB of text; a turn spec reaches the runner in one frame of at
 * most 1 MiB. A turn whose input is heavier than that still runs, on its input cut to fit (the
 * model reads a note of what was left out), and the runner's connection, which an oversized frame
 * would close with every other lease on it, stays up throughout.
 */
let t: TurnPlatform;

beforeAll(async () => {
  t = await startTurnPlatform({ name: 'turn-size-limits' });
});
afterAll(async () => {
  await t?.p.stop();
});

const RULES = [
  { when: { user_contains: 'weather' }, then: [{ tool: 'get_weather', input: { city: 'Paris' } }] },
  { when: { after_tool: 'get_weather', tool_result_contains: 'was cut so that the turn fits' }, then: [{ reply: 'the answer was cut' }] },
  { when: { after_tool: 'get_weather' }, then: [{ reply: 'the answer was whole' }] },
  { when: { user_contains: 'left out so that the turn fits' }, then: [{ reply: 'earlier messages were left out' }] },
  { when: { user_contains: 'was cut so that the turn fits' }, then: [{ reply: 'the message was cut' }] },
  { then: [{ reply: 'a whole message' }] },
];
const WEATHER = { type: 'custom', name: 'get_weather', description: 'Weather', input_schema: { type: 'object', properties: { city: { type: 'string' } } } };
const textOf = (content: unknown): string => (Array.isArray(content) ? content.map((b: { text?: string }) => b.text ?? '').join('') : String(content));
const replies = (events: TurnEvent[]) => events.filter((e) => e.type === 'agent.message').map((e) => textOf(e.payload.content));
const stops = (events: TurnEvent[]) => events.filter((e) => e.type === 'session.status_idle').map((e) => (e.payload.stop_reason as { type: string }).type);
const generations = async (): Promise<number[]> =>
  (await t.p.root.get<{ data: { generation: number }[] }>('/v1/runner-pools/presences')).data.map((r) => r.generation);
/** Two blocks of 600,000 characters: 1.2 MB of text, within the 4 MiB body limit. */
const heavy = (lead: string) => [{ type: 'text', text: `${lead} ${'a'.repeat(600_000)}` }, { type: 'text', text: '報'.repeat(600_000) }];

describe('inputs heavier than a runner frame', () => {
  it('a message of 1.2 MB is answered, cut to fit; the turn after it runs too; the runner never reconnects', async () => {
    const before = await generations();
    const id = (await t.api.post<{ id: string }>('/v1/sessions', { agent: { name: 'big', model: 'default', system: SCRIPT(RULES), tools: [WEATHER] }, environment_id: t.envId })).id;
    await t.api.post(`/v1/sessions/${id}/events`, { type: 'user.message', payload: { content: heavy('hello'), authored_by: t.principal, caused_by: { kind: 'api' } } });
    const first = await untilEvents(t.api, id, (e) => idleCount(e) >= 1, 90_000);
    expect(stops(first)).toEqual(['end_turn']);
    expect(replies(first)).toEqual(['the message was cut']);
    // The heavy message stays in the conversation's log; the next turn leaves it out to fit.
    await t.api.post(`/v1/sessions/${id}/events`, t.msg('and now?'));
    const second = await untilEvents(t.api, id, (e) => idleCount(e) >= 2, 90_000);
    expect(stops(second)).toEqual(['end_turn', 'end_turn']);
    expect(replies(second)).toEqual(['the message was cut', 'earlier messages were left out']);
    expect(await generations()).toEqual(before);
  }, 180_000);

  it('an answer of 1.2 MB to a custom tool is passed on cut to fit', async () => {
    const before = await generations();
    const id = (await t.api.post<{ id: string }>('/v1/sessions', { agent: { name: 'big-answer', model: 'default', system: SCRIPT(RULES), tools: [WEATHER] }, environment_id: t.envId })).id;
    await t.api.post(`/v1/sessions/${id}/events`, t.msg('weather?'));
    const asked = await untilEvents(t.api, id, (e) => idleCount(e) >= 1, 90_000);
    const toolUseId = String(asked.find((e) => e.type === 'agent.tool_use')?.payload.id);
    await t.api.post(`/v1/sessions/${id}/events`, {
      type: 'user.custom_tool_result', payload: { tool_use_id: toolUseId, result: heavy('sunny'), authored_by: t.principal, caused_by: { kind: 'api' } },
    });
    const done = await untilEvents(t.api, id, (e) => idleCount(e) >= 2, 90_000);
    expect(stops(done)).toEqual(['requires_action', 'end_turn']);
    expect(replies(done)).toEqual(['the answer was cut']);
    expect(await generations()).toEqual(before);
  }, 180_000);

  it('an empty text block is refused, as an empty message is (a provider refuses one)', async () => {
    const id = (await t.api.post<{ id: string }>('/v1/sessions', { agent: { name: 'empty', model: 'default', system: SCRIPT(RULES) }, environment_id: t.envId })).id;
    for (const content of ['', [{ type: 'text', text: '' }], [{ type: 'text', text: 'a' }, { type: 'text', text: '' }]]) {
      const r = await t.api.request('POST', `/v1/sessions/${id}/events`, { body: { type: 'user.message', payload: { content, authored_by: t.principal, caused_by: { kind: 'api' } } } });
      expect([r.status, (r.body as { error?: { type: string } }).error?.type], JSON.stringify(content)).toEqual([400, 'validation.malformed']);
    }
  });

  it('a confirmation that allows takes no deny_message (it would be stored and never read)', async () => {
    const id = (await t.api.post<{ id: string }>('/v1/sessions', { agent: { name: 'confirm', model: 'default', system: SCRIPT(RULES) }, environment_id: t.envId })).id;
    const r = await t.api.request('POST', `/v1/sessions/${id}/events`, {
      body: { type: 'user.tool_confirmation', payload: { tool_use_id: 'toolu_1', result: 'allow', deny_message: 'no', authored_by: t.principal, caused_by: { kind: 'api' } } },
    });
    expect([r.status, (r.body as { error?: { message: string } }).error?.message]).toEqual([400, "body.payload.deny_message: only a 'deny' result takes one"]);
  });
});
