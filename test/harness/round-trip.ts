import { expect } from 'vitest';
import { idleCount, SCRIPT, untilEvents, type Json, type TurnEvent, type TurnPlatform } from './turns.js';

/**
 * The custom-tool round trip every topology must pass: a blocking custom tool ends the Run with
 * `requires_action`; `user.custom_tool_result` continues the turn, which ends `end_turn` with the
 * result in the reply. Returns the events of both Runs for further checks.
 */
export async function customToolRoundTrip(
  t: Pick<TurnPlatform, 'api' | 'principal' | 'msg'>,
  newSession: (system: string, tools: Json[]) => Promise<string>,
): Promise<{ first: TurnEvent[]; all: TurnEvent[] }> {
  const id = await newSession(
    SCRIPT([
      { when: { user_contains: 'weather' }, then: [{ tool: 'get_weather', input: { city: 'Paris' } }] },
      { when: { after_tool: 'get_weather' }, then: [{ reply: 'Forecast: {{tool_result}}' }] },
    ]),
    [{ type: 'custom', name: 'get_weather', description: 'Weather for a city', input_schema: { type: 'object', properties: { city: { type: 'string' } } } }],
  );
  await t.api.post(`/v1/sessions/${id}/events`, t.msg('what is the weather?'));
  const first = await untilEvents(t.api, id, (e) => idleCount(e) >= 1);
  expect(first.find((e) => e.type === 'session.status_idle')?.payload.stop_reason).toMatchObject({ type: 'requires_action' });
  const toolUseId = String(first.find((e) => e.type === 'agent.tool_use')?.payload.id);
  expect(toolUseId).toMatch(/^toolu_/);
  await t.api.post(`/v1/sessions/${id}/events`, {
    type: 'user.custom_tool_result', payload: { tool_use_id: toolUseId, result: 'sunny, 21C', authored_by: t.principal, caused_by: { kind: 'api' } },
  });
  const all = await untilEvents(t.api, id, (e) => idleCount(e) >= 2);
  expect(all.filter((e) => e.type === 'agent.message').map((e) => JSON.stringify(e.payload)).join(' ')).toContain('sunny, 21C');
  expect(all.filter((e) => e.type === 'session.status_idle')[1]?.payload.stop_reason).toMatchObject({ type: 'end_turn' });
  return { first, all };
}
