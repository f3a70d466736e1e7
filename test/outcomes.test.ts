import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { Redis } from 'ioredis';
import type { HttpClient } from '@agentplane/client';
import { keys, tags } from '@agentplane/store';
import { waitFor, type Platform } from './harness/platform.js';
import { SCRIPT, startTurnPlatform, untilEvents, type Json, type TurnEvent } from './harness/turns.js';

/**
 * Outcomes end to end with the scripted model and a real runner: `user.define_outcome` starts a
 * turn; each turn that ends normally is graded by a grader Run (leased by the runner, metered by
 * the model gateway); `needs_revision` starts the next turn by itself.
 */
let p: Platform;
let api: HttpClient;
let principal: string;
let envId: string;

beforeAll(async () => {
  ({ p, api, principal, envId } = await startTurnPlatform({ name: 'outcomes' }));
}, 120_000);
afterAll(async () => {
  await p?.stop();
});

const errType = (r: { body: unknown }) => (r.body as { error?: { type?: string } }).error?.type;

/** The agent: turn 1 thinks, writes report.md (v1) and names it; a revision writes v2. */
const AGENT = SCRIPT([
  { when: { user_contains: 'asks for a revision' }, then: [{ tool: 'bash', input: { command: 'echo report-v2-body > /workspace/report.md' } }] },
  { when: { after_tool: 'bash' }, then: [{ reply: 'Done: see `report.md`.' }] },
  { then: [{ think: 'secret-thought-7781' }, { tool: 'bash', input: { command: 'echo report-v1-body > /workspace/report.md' } }] },
]);

/** A rubric whose scripted block makes the scripted grader answer. */
const rubric = (rules: unknown[], criteria = ['The report exists', 'The report is version 2']): string =>
  `${criteria.map((c) => `- ${c}`).join('\n')}\n\n\`\`\`scripted\n${JSON.stringify({ rules })}\n\`\`\`\n`;

async function session(environmentId = envId, system = AGENT): Promise<string> {
  const s = await api.post<{ id: string }>('/v1/sessions', {
    agent: { name: 'reporter', model: 'default', system, tools: [{ type: 'builtin', name: 'bash' }] }, environment_id: environmentId,
  });
  return s.id;
}

const define = (payload: Json) => ({
  type: 'user.define_outcome', payload: { description: 'Write the quarterly report.', authored_by: principal, caused_by: { kind: 'api' }, ...payload },
});

const ended = (e: TurnEvent[]) => e.some((x) => x.type === 'session.outcome_ended');
const outcomeEnd = (e: TurnEvent[]) => e.find((x) => x.type === 'session.outcome_ended')?.payload as Json;

describe('outcomes', () => {
  it('an outcome satisfied on the first evaluation', async () => {
    const id = await session();
    const r = await api.request<Json>('POST', `/v1/sessions/${id}/events`, { body: define({ rubric: rubric([{ then: [{ verdict: 'satisfied' }] }]) }) });
    expect(r.status).toBe(201);
    const evs = await untilEvents(api, id, ended, 90_000);
    expect(outcomeEnd(evs)).toMatchObject({ result: 'satisfied', evaluation_count: 1, revision_count: 0 });
    const started = evs.find((e) => e.type === 'session.outcome_started')?.payload as Json;
    expect(started.max_iterations).toBe(3);
    const evalEnd = evs.find((e) => e.type === 'session.outcome_evaluation_ended')?.payload as Json;
    expect(evalEnd).toMatchObject({ outcome_id: started.outcome_id, iteration: 1, result: 'satisfied' });

    const s = await api.get<{ outcome_evaluations: Json[]; usage: { input_tokens: number } }>(`/v1/sessions/${id}`);
    expect(s.outcome_evaluations).toHaveLength(1);
    const e = s.outcome_evaluations[0] as Json & { criteria: Json[]; usage: { input_tokens: number } };
    expect(e).toMatchObject({ outcome_id: started.outcome_id, iteration: 1, result: 'satisfied' });
    expect(e.criteria).toEqual([
      { criterion: 'The report exists', verdict: 'pass', explanation: null },
      { criterion: 'The report is version 2', verdict: 'pass', explanation: null },
    ]);
    expect(e.usage.input_tokens).toBeGreaterThan(0);
    expect(typeof e.started_at).toBe('string');
    expect(typeof e.ended_at).toBe('string');
    // The grader Run is a Run of the Session: leased by the runner and finished.
    const run = await api.get<Json & { status: string; attempts: Json[] }>(`/v1/runs/${String(e.run_id)}`);
    expect(run.status).toBe('succeeded');
    expect(run.attempts).toHaveLength(1);
    expect(run.grader).toMatchObject({ outcome_id: started.outcome_id, evaluation_id: e.id, iteration: 1 });
  });

  it('needs one revision, then passes; the grader never sees the thinking or the tool transcript', async () => {
    const id = await session();
    await api.post(`/v1/sessions/${id}/events`, define({
      rubric: rubric([
        { when: { user_contains: 'report-v2-body' }, then: [{ verdict: 'satisfied' }] },
        { then: [{ verdict: 'needs_revision', explanation: 'Bring the report to version 2.', criteria: [{ criterion: 'The report is version 2', verdict: 'fail', explanation: 'it is version 1' }] }] },
      ]),
    }));
    const evs = await untilEvents(api, id, ended, 120_000);
    expect(outcomeEnd(evs)).toMatchObject({ result: 'satisfied', evaluation_count: 2, revision_count: 1 });
    const evals = evs.filter((e) => e.type === 'session.outcome_evaluation_ended').map((e) => e.payload as Json);
    expect(evals.map((e) => e.result)).toEqual(['needs_revision', 'satisfied']);
    expect(evals[0]).toMatchObject({ explanation: 'Bring the report to version 2.', evaluation_count: 1, revision_count: 1 });
    expect((evals[0]?.criteria as Json[]).find((c) => c.criterion === 'The report is version 2')).toMatchObject({ verdict: 'fail', explanation: 'it is version 1' });
    // The revision started without a client event: two agent turns, one drive event.
    expect(evs.filter((e) => e.type.startsWith('user.'))).toHaveLength(1);
    expect(evs.filter((e) => e.type === 'agent.thinking')).toHaveLength(1);

    const s = await api.get<{ outcome_evaluations: Json[] }>(`/v1/sessions/${id}`);
    expect(s.outcome_evaluations.map((e) => e.result)).toEqual(['needs_revision', 'satisfied']);
    expect(s.outcome_evaluations.map((e) => e.iteration)).toEqual([1, 2]);

    // What the grader saw: the description, the rubric, the final message and the named file; never the thinking or the bash call.
    const first = await api.get<{ grader_result: { input: { system: string; messages: unknown[] }; output: string } }>(`/v1/runs/${String(s.outcome_evaluations[0]?.run_id)}`);
    const seen = JSON.stringify(first.grader_result.input);
    expect(seen).toContain('Write the quarterly report.');
    expect(first.grader_result.input.system).toContain('The report is version 2');
    expect(seen).toContain('Done: see `report.md`.');
    expect(seen).toContain('report-v1-body');
    expect(seen).not.toContain('secret-thought-7781');
    expect(seen).not.toContain('echo report-v1-body');
    expect(JSON.parse(first.grader_result.output)).toMatchObject({ result: 'needs_revision' });
    const second = await api.get<{ grader_result: { input: unknown } }>(`/v1/runs/${String(s.outcome_evaluations[1]?.run_id)}`);
    expect(JSON.stringify(second.grader_result.input)).toContain('report-v2-body');
  });

  it('grades the colocated topology the same way (the grader Run reads the named file from the sandbox)', async () => {
    const env = await api.post<{ id: string }>('/v1/environments', {
      name: 'colocated', image: 'agentplane/sandbox:latest', harness_topology: 'colocated',
      resources: { cpu_millis: 1000, memory_mib: 256, disk_mib: 512, max_duration_seconds: 120 },
    });
    const id = await session(env.id);
    await api.post(`/v1/sessions/${id}/events`, define({
      rubric: rubric([{ when: { user_contains: 'report-v2-body' }, then: [{ verdict: 'satisfied' }] }, { then: [{ verdict: 'needs_revision', explanation: 'v2 please' }] }]),
    }));
    const evs = await untilEvents(api, id, ended, 120_000);
    expect(outcomeEnd(evs)).toMatchObject({ result: 'satisfied', evaluation_count: 2, revision_count: 1 });
  });

  it('reaches max_iterations_reached when every evaluation asks for a revision', async () => {
    const id = await session();
    await api.post(`/v1/sessions/${id}/events`, define({
      max_iterations: 2,
      rubric: rubric([{ then: [{ verdict: 'needs_revision', explanation: 'Not good enough yet.' }] }]),
    }));
    const evs = await untilEvents(api, id, ended, 120_000);
    expect(outcomeEnd(evs)).toMatchObject({ result: 'max_iterations_reached', evaluation_count: 2, revision_count: 1 });
    const s = await api.get<{ outcome_evaluations: Json[] }>(`/v1/sessions/${id}`);
    expect(s.outcome_evaluations.map((e) => e.result)).toEqual(['needs_revision', 'needs_revision']);
    // The thread is free again: an ordinary message runs an ordinary turn.
    const t = await api.get<{ status: string }>(`/v1/sessions/${id}`);
    expect(t.status).toBe('idle');
  });

  it('user.interrupt during grading ends the outcome interrupted', async () => {
    const id = await session();
    await api.post(`/v1/sessions/${id}/events`, define({ rubric: rubric([{ then: [{ sleep_ms: 60_000 }, { verdict: 'satisfied' }] }]) }));
    const started = await untilEvents(api, id, (e) => e.some((x) => x.type === 'session.outcome_evaluation_started'), 90_000);
    const runId = String((started.find((x) => x.type === 'session.outcome_evaluation_started')?.payload as Json).run_id);
    // Interrupt while the runner holds the grader Run (its model step sleeps).
    await waitFor('the grader Run running', async () => ((await api.get<{ status: string }>(`/v1/runs/${runId}`)).status === 'running' ? true : undefined), 60_000);
    const r = await api.request('POST', `/v1/sessions/${id}/events`, { body: { type: 'user.interrupt', payload: { authored_by: principal, caused_by: { kind: 'api' } } } });
    expect(r.status).toBe(201);
    const evs = await untilEvents(api, id, ended, 60_000);
    expect(outcomeEnd(evs)).toMatchObject({ result: 'interrupted', evaluation_count: 1, revision_count: 0 });
    const s = await api.get<{ outcome_evaluations: Json[]; status: string }>(`/v1/sessions/${id}`);
    expect(s.outcome_evaluations.map((e) => e.result)).toEqual(['interrupted']);
  });

  it('user.interrupt during a revision ends the outcome interrupted', async () => {
    const slowRevision = SCRIPT([
      { when: { user_contains: 'asks for a revision' }, then: [{ sleep_ms: 60_000 }, { reply: 'never' }] },
      { then: [{ reply: 'A first draft.' }] },
    ]);
    const id = await session(envId, slowRevision);
    await api.post(`/v1/sessions/${id}/events`, define({ rubric: rubric([{ then: [{ verdict: 'needs_revision', explanation: 'More.' }] }]) }));
    // The revision turn is running once a status_running follows the first evaluation's end.
    await untilEvents(api, id, (e) => {
      const i = e.findIndex((x) => x.type === 'session.outcome_evaluation_ended');
      return i >= 0 && e.slice(i).some((x) => x.type === 'session.status_running');
    }, 90_000);
    const runs = await api.get<{ data: { id: string; grader?: unknown }[] }>(`/v1/sessions/${id}/runs`);
    const revision = runs.data.find((r) => !r.grader);
    await waitFor('the revision turn running', async () => ((await api.get<{ status: string }>(`/v1/runs/${String(revision?.id)}`)).status === 'running' ? true : undefined), 60_000);
    await api.post(`/v1/sessions/${id}/events`, { type: 'user.interrupt', payload: { authored_by: principal, caused_by: { kind: 'api' } } });
    const evs = await untilEvents(api, id, ended, 60_000);
    expect(outcomeEnd(evs)).toMatchObject({ result: 'interrupted', evaluation_count: 1, revision_count: 1 });
  });

  it('after max_iterations_reached, the next turn does not read the last evaluation as a revision request', async () => {
    const id = await session(envId, SCRIPT([
      { when: { user_contains: 'asks for a revision' }, then: [{ reply: 'Revising as the grader asked.' }] },
      { then: [{ reply: 'A plain answer.' }] },
    ]));
    await api.post(`/v1/sessions/${id}/events`, define({ max_iterations: 1, rubric: rubric([{ then: [{ verdict: 'needs_revision', explanation: 'Not good enough yet.' }] }]) }));
    const evs = await untilEvents(api, id, ended, 90_000);
    expect(outcomeEnd(evs)).toMatchObject({ result: 'max_iterations_reached', evaluation_count: 1, revision_count: 0 });
    await api.post(`/v1/sessions/${id}/events`, { type: 'user.message', payload: { content: 'hello', authored_by: principal, caused_by: { kind: 'api' } } });
    const all = await untilEvents(api, id, (e) => e.filter((x) => x.type === 'agent.message').length >= 2, 60_000);
    const replies = all.filter((e) => e.type === 'agent.message').map((e) => JSON.stringify(e.payload.content));
    expect(replies[1]).toContain('A plain answer.');
  });

  it('archive while the grader Run runs: the evaluation is recorded, no revision starts, the outcome ends interrupted', async () => {
    const id = await session(envId, SCRIPT([{ then: [{ reply: 'A first draft.' }] }]));
    await api.post(`/v1/sessions/${id}/events`, define({ rubric: rubric([{ then: [{ sleep_ms: 3000 }, { verdict: 'needs_revision', explanation: 'More.' }] }]) }));
    const started = await untilEvents(api, id, (e) => e.some((x) => x.type === 'session.outcome_evaluation_started'), 90_000);
    const runId = String((started.find((x) => x.type === 'session.outcome_evaluation_started')?.payload as Json).run_id);
    await waitFor('the grader Run running', async () => ((await api.get<{ status: string }>(`/v1/runs/${runId}`)).status === 'running' ? true : undefined), 60_000);
    expect((await api.request('POST', `/v1/sessions/${id}/archive`, { body: {} })).status).toBe(200);
    const evs = await untilEvents(api, id, (e) => e.some((x) => ['session.status_completed', 'session.status_canceled', 'session.status_failed'].includes(x.type)), 60_000);
    const evaluation = evs.find((e) => e.type === 'session.outcome_evaluation_ended')?.payload as Json | undefined;
    expect(evaluation).toMatchObject({ run_id: runId, iteration: 1, result: 'needs_revision', explanation: 'More.', evaluation_count: 1, revision_count: 0 });
    expect(outcomeEnd(evs)).toMatchObject({ result: 'interrupted', evaluation_count: 1, revision_count: 0, reason: 'the session was archived' });
    const s = await api.get<{ outcome_evaluations: Json[] }>(`/v1/sessions/${id}`);
    expect(s.outcome_evaluations.map((e) => [e.run_id, e.result])).toEqual([[runId, 'needs_revision']]);
    // No revision turn: the agent's turn and the grader Run only.
    expect((await api.get<{ data: Json[] }>(`/v1/sessions/${id}/runs`)).data).toHaveLength(2);
  });

  it('a question inside an outcome\'s turn: graded once answered; archived while it waits, the outcome ends interrupted', async () => {
    const question = { questions: [{ question: 'Which colour?', options: ['red', 'blue'] }] };
    const asker = SCRIPT([
      { when: { after_tool: 'ask_user' }, then: [{ reply: 'Done in {{tool_result}}' }] },
      { then: [{ tool: 'ask_user', input: question }] },
    ]);
    const asking = async () => (await api.post<{ id: string }>('/v1/sessions', {
      agent: { name: 'asker', model: 'default', system: asker, tools: [{ type: 'builtin', name: 'ask_user' }] }, environment_id: envId,
    })).id;
    const waiting = async (id: string) => {
      const evs = await untilEvents(api, id, (e) => e.some((x) => x.type === 'session.status_idle'), 60_000);
      expect(evs.find((e) => e.type === 'session.status_idle')?.payload.stop_reason).toMatchObject({ type: 'requires_action' });
      return String(evs.find((e) => e.type === 'agent.tool_use')?.payload.id);
    };
    const satisfiedOnBlue = rubric([{ when: { user_contains: 'blue' }, then: [{ verdict: 'satisfied' }] }, { then: [{ verdict: 'failed', explanation: 'no colour' }] }]);

    // Answered: the turn continues, and its end is graded.
    const id = await asking();
    await api.post(`/v1/sessions/${id}/events`, define({ rubric: satisfiedOnBlue }));
    const toolUseId = await waiting(id);
    const busy = await api.request('POST', `/v1/sessions/${id}/events`, { body: define({ rubric: '- ok' }) });
    expect([busy.status, errType(busy)]).toEqual([409, 'runtime.invalid_transition']);
    const answered = await api.request('POST', `/v1/sessions/${id}/events`, {
      body: { type: 'user.question_answer', payload: { tool_use_id: toolUseId, answers: [{ selected: ['blue'] }], authored_by: principal, caused_by: { kind: 'api' } } },
    });
    expect(answered.status).toBe(201);
    const evs = await untilEvents(api, id, ended, 90_000);
    expect(outcomeEnd(evs)).toMatchObject({ result: 'satisfied', evaluation_count: 1, revision_count: 0 });

    // Archived while the question waits: no answer can come, so the outcome ends now, before the Session's terminal event.
    const other = await asking();
    await api.post(`/v1/sessions/${other}/events`, define({ rubric: satisfiedOnBlue }));
    await waiting(other);
    expect((await api.request('POST', `/v1/sessions/${other}/archive`, { body: {} })).status).toBe(200);
    const closed = await untilEvents(api, other, (e) => e.some((x) => x.type === 'session.status_canceled'), 30_000);
    const types = closed.map((e) => e.type);
    expect(outcomeEnd(closed)).toMatchObject({ result: 'interrupted', evaluation_count: 0, revision_count: 0, reason: 'the session was archived' });
    expect(types.indexOf('session.outcome_ended')).toBeLessThan(types.indexOf('session.status_canceled'));
    // An archive sent again ends nothing twice.
    expect((await api.request('POST', `/v1/sessions/${other}/archive`, { body: {} })).status).toBe(200);
    const thread = (await api.get<{ data: { id: string }[] }>(`/v1/sessions/${other}/threads`)).data[0]?.id ?? '';
    const log = (await api.get<{ data: TurnEvent[] }>(`/v1/sessions/${other}/threads/${thread}/events`, { limit: 1000 })).data;
    expect(log.filter((e) => e.type === 'session.outcome_ended')).toHaveLength(1);
  });

  it('of defines sent together on an idle thread, one starts an outcome; the others are 409 and write nothing', async () => {
    const id = await session(envId, SCRIPT([{ then: [{ reply: 'Done.' }] }]));
    const satisfied = rubric([{ then: [{ verdict: 'satisfied' }] }]);
    const rs = await Promise.all([1, 2, 3].map((n) => api.request<Json>('POST', `/v1/sessions/${id}/events`, { body: define({ description: `Outcome ${n}.`, rubric: satisfied }) })));
    expect(rs.map((r) => r.status).sort()).toEqual([201, 409, 409]);
    for (const r of rs.filter((x) => x.status === 409)) expect(errType(r)).toBe('runtime.invalid_transition');
    const winner = rs.find((r) => r.status === 201)?.body as Json;
    const evs = await untilEvents(api, id, ended, 90_000);
    expect(outcomeEnd(evs)).toMatchObject({ result: 'satisfied', evaluation_count: 1 });
    expect(evs.filter((e) => e.type === 'user.define_outcome').map((e) => e.id)).toEqual([winner.id]);
    expect(evs.filter((e) => e.type === 'session.outcome_started')).toHaveLength(1);
    // One outcome document, one agent turn and one grader Run.
    const redis = new Redis(p.redisUrl());
    try {
      expect(await redis.zcard(keys.index(tags.session(id), 'outcomes'))).toBe(1);
    } finally {
      redis.disconnect();
    }
    expect((await api.get<{ data: Json[] }>(`/v1/sessions/${id}/runs`)).data).toHaveLength(2);
    // The thread is free again once the outcome ended.
    const next = await api.request<Json>('POST', `/v1/sessions/${id}/events`, { body: define({ rubric: satisfied }) });
    expect(next.status).toBe(201);
    const after = await untilEvents(api, id, (e) => e.filter((x) => x.type === 'session.outcome_ended').length >= 2, 90_000);
    expect(after.filter((e) => e.type === 'session.outcome_ended').map((e) => (e.payload as Json).result)).toEqual(['satisfied', 'satisfied']);
  });

  it('a revision turn acts for the Principal who defined the outcome: that Principal\'s ActionPolicies hold in it', async () => {
    // Only the revision's command is denied, and only for the outcome's author.
    const rule = (await p.root.post<{ id: string }>('/v1/action-policies', {
      effect: 'deny', tool: { kind: 'builtin', name: 'bash' }, arguments: { command_prefix: 'echo report-v2-body' }, principal_id: principal,
    })).id;
    try {
      const id = await session();
      await api.post(`/v1/sessions/${id}/events`, define({
        max_iterations: 2,
        rubric: rubric([
          { when: { user_contains: 'report-v2-body' }, then: [{ verdict: 'satisfied' }] },
          { then: [{ verdict: 'needs_revision', explanation: 'Bring the report to version 2.' }] },
        ]),
      }));
      const evs = await untilEvents(api, id, ended, 120_000);
      const results = evs.filter((e) => e.type === 'agent.tool_result').map((e) => e.payload as Json);
      expect(results).toHaveLength(2);
      // The first turn's command ran; the revision's was refused by the author's rule.
      expect(results[0]?.denied).toBeUndefined();
      expect(results[1]).toMatchObject({ denied: true, is_error: true, policy_rule_id: rule });
      expect(outcomeEnd(evs).result).not.toBe('satisfied');
    } finally {
      await p.root.request('DELETE', `/v1/action-policies/${rule}`);
    }
  });

  it('takes its rubric from a File', async () => {
    const text = rubric([{ then: [{ verdict: 'satisfied', criteria: [{ criterion: 'Cites the file rubric', verdict: 'pass', explanation: 'it does' }] }] }], ['Cites the file rubric']);
    const up = await api.uploadFile<{ id: string }>('rubric.md', new TextEncoder().encode(text), { contentType: 'text/markdown' });
    expect(up.status).toBe(201);
    const id = await session();
    await api.post(`/v1/sessions/${id}/events`, define({ rubric: { type: 'file', file_id: up.body.id } }));
    const evs = await untilEvents(api, id, ended, 90_000);
    expect(outcomeEnd(evs)).toMatchObject({ result: 'satisfied', evaluation_count: 1 });
    const s = await api.get<{ outcome_evaluations: Json[] }>(`/v1/sessions/${id}`);
    expect(s.outcome_evaluations[0]?.criteria).toEqual([{ criterion: 'Cites the file rubric', verdict: 'pass', explanation: 'it does' }]);
    const run = await api.get<{ grader_result: { input: { system: string } } }>(`/v1/runs/${String(s.outcome_evaluations[0]?.run_id)}`);
    expect(run.grader_result.input.system).toContain('Cites the file rubric');
  });

  it('starts from the initial_events of a new Session', async () => {
    const s = await api.post<{ id: string }>('/v1/sessions', {
      agent: { name: 'reporter', model: 'default', system: AGENT, tools: [{ type: 'builtin', name: 'bash' }] }, environment_id: envId,
      initial_events: [define({ rubric: rubric([{ then: [{ verdict: 'satisfied' }] }]) })],
    });
    const evs = await untilEvents(api, s.id, ended, 90_000);
    expect(outcomeEnd(evs)).toMatchObject({ result: 'satisfied', evaluation_count: 1 });
    const two = await api.request('POST', '/v1/sessions', {
      body: { agent: { name: 'r', model: 'default' }, environment_id: envId, initial_events: [define({ rubric: '- a' }), define({ rubric: '- b' })] },
    });
    expect(two.status).toBe(400);
    expect(errType(two)).toBe('validation.malformed');
  });

    it('refuses what an outcome cannot start with', async () => {
    const id = await session();
    const tooMany = await api.request('POST', `/v1/sessions/${id}/events`, { body: define({ rubric: '- ok', max_iterations: 21 }) });
    expect(tooMany.status).toBe(400);
    expect(errType(tooMany)).toBe('validation.malformed');
    const noRubric = await api.request('POST', `/v1/sessions/${id}/events`, { body: define({}) });
    expect(noRubric.status).toBe(400);
    const missing = await api.request('POST', `/v1/sessions/${id}/events`, { body: define({ rubric: { type: 'file', file_id: `file_${'0'.repeat(32)}` } }) });
    expect(missing.status).toBe(404);
    expect(errType(missing)).toBe('validation.not_found');
    // A File rubric is text, as an inline one: not empty, UTF-8.
    for (const [name, bytes] of [['empty.md', new Uint8Array(0)], ['binary.md', new Uint8Array([0xff, 0xfe, 0x00, 0x80])]] as const) {
      const up = await api.uploadFile<{ id: string }>(name, bytes, { contentType: 'text/markdown' });
      expect(up.status).toBe(201);
      const r = await api.request('POST', `/v1/sessions/${id}/events`, { body: define({ rubric: { type: 'file', file_id: up.body.id } }) });
      expect([r.status, errType(r)], name).toEqual([400, 'validation.malformed']);
    }
    const noProfile = await api.request('POST', `/v1/sessions/${id}/events`, { body: define({ rubric: '- ok', grader_model: 'no-such-profile' }) });
    expect(noProfile.status).toBe(422);
    expect(errType(noProfile)).toBe('model.no_eligible_model');
    // While one outcome works, the thread takes no second one.
    expect((await api.request('POST', `/v1/sessions/${id}/events`, { body: define({ rubric: rubric([{ then: [{ sleep_ms: 60_000 }, { verdict: 'satisfied' }] }]) }) })).status).toBe(201);
    const busy = await api.request('POST', `/v1/sessions/${id}/events`, { body: define({ rubric: '- ok' }) });
    expect(busy.status).toBe(409);
    expect(errType(busy)).toBe('runtime.invalid_transition');
    await api.post(`/v1/sessions/${id}/events`, { type: 'user.interrupt', payload: { authored_by: principal, caused_by: { kind: 'api' } } });
    await untilEvents(api, id, ended, 90_000);
  });
});
