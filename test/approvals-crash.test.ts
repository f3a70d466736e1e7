import { beforeAll, describe, expect, it } from 'vitest';
import { existsSync } from 'node:fs';
import { waitFor } from './harness/platform.js';
import { useCrashPlatforms, type CrashTurnPlatform } from './harness/crash-platform.js';
import { SCRIPT, untilEvents, type TurnEvent } from './harness/turns.js';

/**
 * The API dies inside a Run's tool check, right after it wrote the ActionApproval the check asked
 * for (a named crash point, `AGENTPLANE_CRASH_AT`), before anything that follows that write. The
 * runner asks again once the API is back. Without the expiry job and the request event that
 * follow the write, the approval stayed pending past its expiry and the Session waited for good.
 */
const crash = useCrashPlatforms('approvals-crash');
let t: CrashTurnPlatform;
beforeAll(async () => {
  t = await crash.startTurn(['approval-written'], { name: 'approvals-crash' });
}, 180_000);

const count = (events: TurnEvent[], type: string) => events.filter((e) => e.type === type).length;

describe('a crash right after an ActionApproval was written', () => {
  it('the approval still expires through its delayed job, its request is in the log and the audit once, and the turn goes on', async () => {
    const { api, p } = t;
    await p.root.post('/v1/action-policies', {
      effect: 'require_approval', tool: { kind: 'builtin', name: 'bash' }, arguments: { command_prefix: 'echo crash-gate' }, approval_expires_in_seconds: 3,
    });
    const s = await api.post<{ id: string }>('/v1/sessions', {
      agent: {
        name: 'approver', model: 'default', tools: [{ type: 'builtin', name: 'bash' }],
        system: SCRIPT([
          { when: { user_contains: 'run' }, then: [{ tool: 'bash', input: { command: 'echo crash-gate output-text' } }] },
          { when: { on: 'tool_result' }, then: [{ reply: 'Result: {{tool_result}}' }] },
        ]),
      },
      environment_id: t.envId,
    });
    const apiBefore = p.pids().api;
    await api.post(`/v1/sessions/${s.id}/events`, t.msg('run it'));
    // The Run's tool check reaches the crash point: the API dies and is started again.
    await waitFor('the crash point reached', () => (existsSync(t.marker('approval-written')) ? true : undefined), 90_000);
    await t.apiRestarted(apiBefore, { client: api, path: `/v1/sessions/${s.id}` }, 60_000);

    // The approval written before the crash expires (3 s), and the turn ends with the refusal.
    const events = await untilEvents(api, s.id, (e) => {
      const expired = e.findIndex((x) => x.type === 'session.action_approval_expired');
      return expired >= 0 && e.slice(expired).some((x) => x.type === 'session.status_idle');
    }, 90_000);
    const approvals = await p.root.get<{ data: { id: string; status: string; tool_use_id: string }[] }>(`/v1/sessions/${s.id}/action-approvals`);
    expect(approvals.data.map((a) => a.status)).toEqual(['expired']);
    const approval = approvals.data[0]!;
    expect(count(events, 'session.action_approval_requested')).toBe(1);
    expect(count(events, 'session.action_approval_expired')).toBe(1);
    expect(events.find((e) => e.type === 'session.action_approval_requested')?.payload).toMatchObject({ approval_id: approval.id, tool_use_id: approval.tool_use_id });
    const results = events.filter((e) => e.type === 'agent.tool_result' && e.payload.tool_use_id === approval.tool_use_id);
    expect(results.length).toBeGreaterThanOrEqual(1);
    for (const r of results) {
      expect(r.payload).toMatchObject({ is_error: true, denied: true });
      expect(String(r.payload.content)).not.toContain('output-text');
    }
    const audit = await p.root.post<{ data: { action: string }[] }>('/v1/audit/export', { target: approval.id });
    expect(audit.data.map((r) => r.action).sort()).toEqual(['action_approval.expired', 'action_approval.requested']);
  }, 300_000);
});
