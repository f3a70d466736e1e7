import { existsSync, writeFileSync } from 'node:fs';
import { beforeAll, describe, expect, it } from 'vitest';
import type { HttpClient } from '@agentplane/client';
import { waitFor } from './harness/platform.js';
import { useCrashPlatforms, type CrashPlatform } from './harness/crash-platform.js';
import { authorInstructions, developerWorkspace, untilEvents, type Json } from './harness/turns.js';

/**
 * The API killed between the writes of a skill proposal's create and of its verify (crash points
 * `skill-proposal-created`: the proposal written, its authoring job not yet queued;
 * `skill-verification-recorded`: the attempt recorded, its Session not yet made). The outbox
 * entry the sweep works from is written before either, so the work goes on without the client:
 * the proposal is authored, and the attempt's Session is created, driven and watched. No runner:
 * authoring needs only the model, and a launched attempt only its Session.
 */
const crash = useCrashPlatforms('skp-crash');
let c: CrashPlatform;
let api: HttpClient;
let principal: string;
let envId: string;
let source: string;

const CREATE = { 'service-version': '2026-08-29' };
/** The proposals whose work the sweep resumes (docs/SKILLS.md, "Queue and keys"). */
const OUTBOX = 'ap:{g:skill_proposal_outbox}:skill_proposal_outbox';
const ANSWER = {
  name: 'crash-greeting', description: 'Greets visitors after a crash.', instructions: 'Greet with CRASH-OK.',
  task: 'Greet the visitor named Ada.', rubric: '- The answer greets Ada with CRASH-OK',
};
type Proposal = Json & { id: string; status: string; version: number; verifications: Array<Json & { session: string; launched_at: string | null }> };

const read = (id: string) => api.get<Proposal>(`/v1/skill-proposals/${id}`);

beforeAll(async () => {
  c = await crash.start(['skill-proposal-created', 'skill-verification-recorded'], { env: { LOG_LEVEL: 'warn' } });
  ({ api, principal, envId } = await developerWorkspace(c.p, 'skp-crash'));
  const agent = (await api.post<{ id: string }>('/v1/agents', { name: 'greeter', model: 'default', system: 'Be brief.' })).id;
  source = (await api.post<{ id: string }>('/v1/sessions', { agent, environment_id: envId })).id;
}, 120_000);

/** Waits until the proposal is out of `authoring`. */
const authored = (id: string) => waitFor('the proposal authored', async () => {
  const x = await read(id);
  return x.status !== 'authoring' ? x : undefined;
}, 60_000);

describe('a crash inside a skill proposal create or verify', () => {
  const body = () => ({ source_session_ids: [source], model_routing_profile_key: 'default', instructions: authorInstructions(ANSWER) });

  it('after the proposal is written: the sweep queues its authoring', async () => {
    const before = c.p.pids().api;
    await expect(api.request('POST', '/v1/skill-proposals', { body: body(), headers: CREATE })).rejects.toThrow();
    expect(existsSync(c.marker('skill-proposal-created'))).toBe(true);
    await c.apiRestarted(before, { client: api, path: '/v1/skill-proposals' });
    const listed = await api.get<{ data: Proposal[] }>('/v1/skill-proposals');
    expect(listed.data).toHaveLength(1);
    // Nobody retries: the sweep queues the job the dead process never queued.
    expect((await authored(listed.data[0]?.id ?? '')).status).toBe('drafted');
  }, 120_000);

  it('after the verification attempt is recorded: the sweep creates and drives its Session', async () => {
    // This proposal's create passes its crash point (a marker says the point was reached once).
    if (!existsSync(c.marker('skill-proposal-created'))) writeFileSync(c.marker('skill-proposal-created'), '');
    const created = await api.request<Proposal>('POST', '/v1/skill-proposals', { body: body(), headers: CREATE });
    expect(created.status).toBe(201);
    const id = created.body.id;
    const drafted = await authored(id);
    expect(drafted.status).toBe('drafted');
    // The sweep has let go of the drafted proposal: only what the verify writes can bring it back.
    const ws = c.p.bootstrap.workspace_id;
    await waitFor('the outbox entry dropped', async () => ((await c.redis().zscore(OUTBOX, `${ws}/${id}`)) === null ? true : undefined), 60_000);
    const before = c.p.pids().api;
    await expect(api.request('POST', `/v1/skill-proposals/${id}/verify`, { body: { expected_version: drafted.version, principal } })).rejects.toThrow();
    expect(existsSync(c.marker('skill-verification-recorded'))).toBe(true);
    await c.apiRestarted(before, { client: api, path: `/v1/skill-proposals/${id}` });
    const recorded = await read(id);
    expect(recorded.status).toBe('verifying');
    expect(recorded.verifications).toHaveLength(1);
    // Nobody retries: the sweep creates and drives the attempt's reserved Session.
    const launched = await waitFor('the attempt launched', async () => {
      const x = await read(id);
      return x.verifications[0]?.launched_at ? x : undefined;
    }, 60_000);
    expect(launched.verifications).toHaveLength(1);
    const session = launched.verifications[0]?.session ?? '';
    const s = await api.get<Json & { metadata: Json }>(`/v1/sessions/${session}`);
    expect(s.metadata).toEqual({ skill_proposal_id: id });
    const events = await untilEvents(api, session, (e) => e.some((x) => x.type === 'user.define_outcome'), 30_000);
    expect(events.find((e) => e.type === 'user.define_outcome')?.payload).toMatchObject({ authored_by: principal, description: ANSWER.task });
  }, 180_000);
});
