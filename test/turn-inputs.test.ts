import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { waitFor } from './harness/platform.js';
import { idleCount, SCRIPT, startTurnPlatform, untilEvents, type TurnEvent, type TurnPlatform } from './harness/turns.js';

/**
 * A message sent while a turn is on its way (queued, its Run not yet leased) is the next turn's
 * input: it never appears in the conversation of the turn before it, however late that turn's
 * spec is built. The runner is held drained while the messages arrive, so the earlier turn's
 * spec is always built after the later message is in the log.
 */
let t: TurnPlatform;
let runnerId: string;

beforeAll(async () => {
  t = await startTurnPlatform({ name: 'turn-inputs' });
  runnerId = (await t.p.root.get<{ data: { runner: string }[] }>('/v1/runner-pools/presences')).data[0]?.runner ?? '';
});
afterAll(async () => {
  await t?.p.stop();
});

const RULES = [
  { when: { user_contains: 'weather' }, then: [{ tool: 'get_weather', input: { city: 'Paris' } }] },
  { when: { after_tool: 'get_weather' }, then: [{ reply: 'Got: {{tool_result}}' }] },
  { then: [{ reply: 'echo {{user}}' }] },
];
const WEATHER = { type: 'custom', name: 'get_weather', description: 'Weather', input_schema: { type: 'object', properties: { city: { type: 'string' } } } };

async function session(): Promise<string> {
  return (await t.api.post<{ id: string }>('/v1/sessions', { agent: { name: 'echo', model: 'default', system: SCRIPT(RULES), tools: [WEATHER] }, environment_id: t.envId })).id;
}
const textOf = (content: unknown): string => (Array.isArray(content) ? content.map((b: { text?: string }) => b.text ?? '').join('') : String(content));
const replies = (events: TurnEvent[]) => events.filter((e) => e.type === 'agent.message').map((e) => textOf(e.payload.content));
const presence = async () => (await t.p.root.get<{ data: { runner: string; status: string }[] }>('/v1/runner-pools/presences')).data.find((r) => r.runner === runnerId)?.status;

/** Runs `send` with the runner drained (nothing is leased meanwhile), then lets it work again. */
async function whileDrained(send: () => Promise<void>): Promise<void> {
  await t.p.root.post(`/v1/runners/${runnerId}/drain`, { reason: 'hold the turns' });
  await waitFor('the runner draining', async () => ((await presence()) === 'draining' ? true : undefined), 30_000);
  await send();
  await t.p.root.post(`/v1/runners/${runnerId}/resume`, {});
  await waitFor('the runner ready', async () => ((await presence()) === 'ready' ? true : undefined), 30_000);
}

describe('turn inputs', () => {
  it('a message queued behind a turn that has not started is answered once, by the next turn', async () => {
    const id = await session();
    await whileDrained(async () => {
      await t.api.post(`/v1/sessions/${id}/events`, t.msg('first'));
      await t.api.post(`/v1/sessions/${id}/events`, t.msg('second'));
    });
    const events = await untilEvents(t.api, id, (e) => idleCount(e) >= 2, 90_000);
    expect(replies(events)).toEqual(['echo first', 'echo second']);
  }, 180_000);

  it('a message sent right after a custom tool result waits for the continuation to answer the tool first', async () => {
    const id = await session();
    await t.api.post(`/v1/sessions/${id}/events`, t.msg('weather?'));
    const first = await untilEvents(t.api, id, (e) => idleCount(e) >= 1, 90_000);
    const toolUseId = String(first.find((e) => e.type === 'agent.tool_use')?.payload.id);
    await whileDrained(async () => {
      await t.api.post(`/v1/sessions/${id}/events`, {
        type: 'user.custom_tool_result', payload: { tool_use_id: toolUseId, result: 'sunny', authored_by: t.principal, caused_by: { kind: 'api' } },
      });
      await t.api.post(`/v1/sessions/${id}/events`, t.msg('second'));
    });
    const events = await untilEvents(t.api, id, (e) => idleCount(e) >= 3, 90_000);
    expect(replies(events)).toEqual(['Got: sunny', 'echo second']);
  }, 180_000);
});
