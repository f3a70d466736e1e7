import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { idleCount, SCRIPT, startTurnPlatform, untilEvents, type TurnPlatform } from './harness/turns.js';

/**
 * An answer and an interrupt of its wait sent at once: whichever wins, the log agrees with the
 * answers. An answer refused (409, the wait no longer current) leaves nothing in the log; one
 * accepted is in it once. (The answer's event and its record on the wait are one script: an
 * answer used to be appended before the record, so a refused one stayed in the log.)
 */
let t: TurnPlatform;

beforeAll(async () => {
  t = await startTurnPlatform({ name: 'answer-interrupt-race' });
});
afterAll(async () => {
  await t?.p.stop();
});

const RULES = [
  { when: { user_contains: 'weather' }, then: [{ tool: 'get_weather', input: { city: 'Paris' } }] },
  { when: { after_tool: 'get_weather' }, then: [{ reply: 'Got: {{tool_result}}' }] },
];
const WEATHER = { type: 'custom', name: 'get_weather', description: 'Weather', input_schema: { type: 'object', properties: { city: { type: 'string' } } } };
interface Ev { type: string; payload: Record<string, unknown> }

describe('an answer racing an interrupt of its wait', () => {
  it('a refused answer is not in the log, an accepted one is, once', async () => {
    for (let round = 0; round < 12; round++) {
      const id = (await t.api.post<{ id: string }>('/v1/sessions', { agent: { name: 'race', model: 'default', system: SCRIPT(RULES), tools: [WEATHER] }, environment_id: t.envId })).id;
      await t.api.post(`/v1/sessions/${id}/events`, t.msg('weather?'));
      const asked = await untilEvents(t.api, id, (e) => idleCount(e) >= 1, 60_000);
      const toolUseId = String(asked.find((e) => e.type === 'agent.tool_use')?.payload.id);
      const send = (type: string, extra: Record<string, unknown>) => t.api.request('POST', `/v1/sessions/${id}/events`, { body: { type, payload: { ...extra, authored_by: t.principal, caused_by: { kind: 'api' } } } });
      const [, answer] = await Promise.all([send('user.interrupt', {}), send('user.custom_tool_result', { tool_use_id: toolUseId, result: 'sunny' })]);
      expect([201, 409], JSON.stringify(answer.body)).toContain(answer.status);
      // Both answered: whatever either wrote is in the log by now.
      const primary = (await t.api.get<{ data: { id: string; parent_thread_id: string | null }[] }>(`/v1/sessions/${id}/threads`)).data.find((th) => th.parent_thread_id === null)?.id;
      const logged = (await t.api.get<{ data: Ev[] }>(`/v1/sessions/${id}/threads/${primary}/events?limit=100`)).data.filter((e) => e.type === 'user.custom_tool_result');
      expect(logged.length, `round ${round}: answer ${answer.status}`).toBe(answer.status === 201 ? 1 : 0);
    }
  }, 300_000);
});
