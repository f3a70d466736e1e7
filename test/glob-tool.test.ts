import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { idleCount, SCRIPT, startTurnPlatform, untilEvents, type Json, type TurnEvent, type TurnPlatform } from './harness/turns.js';

/**
 * A glob chosen by the model must never stall the runner: the matcher is linear-time and the
 * glob tool yields to the event loop, so another Session on the same runner keeps running its
 * turns and no lease misses its heartbeats while one Session globs (the split topology, where
 * the agent loop runs in the runner process).
 */
let t: TurnPlatform;

beforeAll(async () => {
  t = await startTurnPlatform({ name: 'glob-tool', env: { RUNNER_MAX_SLOTS: '4' } });
}, 120_000);
afterAll(async () => {
  await t?.p.stop();
});

async function session(system: string, tools: Json[]): Promise<string> {
  return (await t.api.post<{ id: string }>('/v1/sessions', { agent: { name: 'scripted', model: 'default', system, tools }, environment_id: t.envId })).id;
}

const text = (events: TurnEvent[]): string => events.filter((e) => e.type === 'agent.message').map((e) => JSON.stringify(e.payload)).join(' ');
const rescheduled = (events: TurnEvent[]): TurnEvent[] => events.filter((e) => e.type === 'session.thread_status_rescheduled');

describe('the glob tool on a shared runner', () => {
  it('a backtracking-hostile pattern neither stalls another Session nor costs a heartbeat', async () => {
    // 50 files named with 44 `a`s, and g/*a*a…*az (11 × `*a`): exponential for a backtracking
    // matcher, since no name ends in z.
    const make = `mkdir -p g && for i in $(seq 10 59); do : > "g/${'a'.repeat(44)}$i"; done && ls g | wc -l`;
    const pattern = `g/${'*a'.repeat(11)}z`;
    const globber = await session(
      SCRIPT([
        { when: { user_contains: 'glob' }, then: [{ tool: 'bash', input: { command: make } }] },
        { when: { after_tool: 'bash' }, then: [{ tool: 'glob', input: { pattern } }] },
        { when: { after_tool: 'glob' }, then: [{ reply: 'globbed: {{tool_result}}' }] },
      ]),
      [{ type: 'builtin', name: 'bash' }, { type: 'builtin', name: 'glob' }],
    );
    // The other Session: a warm-up turn, then a turn of four quick tool steps and a reply, long
    // enough to overlap the glob however the two Sessions' steps interleave.
    const steps = [1, 2, 3, 4].map((turn) => ({ when: { turn }, then: [{ tool: 'bash', input: { command: `echo step ${turn}` } }] }));
    const other = await session(
      SCRIPT([{ when: { turn: 0 }, then: [{ reply: 'warm' }] }, ...steps, { when: { turn: 5 }, then: [{ reply: 'pong' }] }]),
      [{ type: 'builtin', name: 'bash' }],
    );

    // The other Session's sandbox is up before the glob starts.
    await t.api.post(`/v1/sessions/${other}/events`, t.msg('warm up'));
    const warm = await untilEvents(t.api, other, (e) => idleCount(e) >= 1);
    expect(text(warm)).toContain('warm');

    await t.api.post(`/v1/sessions/${globber}/events`, t.msg('glob please'));
    const started = await untilEvents(t.api, globber, (e) => e.some((x) => x.type === 'agent.tool_use' && x.payload.name === 'glob'));
    expect(started.find((e) => e.type === 'agent.tool_result')?.payload.content).toContain('50');

    // While the glob runs, the other Session's turn completes promptly.
    const sent = Date.now();
    await t.api.post(`/v1/sessions/${other}/events`, t.msg('ping again'));
    const second = await untilEvents(t.api, other, (e) => idleCount(e) >= 1, 30_000, String(warm.at(-1)?.seq));
    expect(idleCount(second), 'the other Session finished its turn').toBe(1);
    expect(second.find((e) => e.type === 'session.status_idle')?.payload.stop_reason).toMatchObject({ type: 'end_turn' });
    expect(text(second)).toContain('pong');
    expect(Date.now() - sent).toBeLessThan(30_000);

    const globbed = await untilEvents(t.api, globber, (e) => idleCount(e) >= 1, 30_000);
    expect(text(globbed)).toContain('no files matched');
    const result = globbed.find((e) => e.type === 'agent.tool_result' && String(e.payload.content).includes('no files matched'));
    expect(result?.payload.is_error).toBe(false);

    // No Run lost its lease: neither Session was rescheduled, each Run took one attempt.
    const all = [...(await untilEvents(t.api, other, (e) => idleCount(e) >= 2, 10_000)), ...globbed];
    expect(rescheduled(all)).toEqual([]);
    for (const id of [globber, other]) {
      const runs = await t.api.get<{ data: { status: string; attempts: unknown[] }[] }>(`/v1/sessions/${id}/runs`);
      for (const run of runs.data) expect(run).toMatchObject({ status: 'succeeded', attempts: [expect.anything()] });
    }
  }, 120_000);
});
