import { execFileSync } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { HttpClient } from '@agentplane/client';
import { waitFor, type Platform } from './harness/platform.js';
import { authorInstructions, idleCount, RUBRIC, SCRIPT, startTurnPlatform, untilEvents, type Json, type TurnPlatform } from './harness/turns.js';
import { errType } from './harness/governance.js';

/**
 * Skill proposals end to end with the scripted model and a real runner: authoring from two
 * Sessions, verification in one isolated Session graded by the Outcome grader (satisfied;
 * failing and verified again), the resumable verify, submission to a local bare repository
 * (branch and commit checked with git), adoption after a merge, every invalid transition and
 * the consistency rules in every state seen.
 */
let t: TurnPlatform;
let p: Platform;
let api: HttpClient;
let dir: string;
let bare: string;

const GIT_ENV = { ...process.env, GIT_AUTHOR_NAME: 't', GIT_AUTHOR_EMAIL: 't@t', GIT_COMMITTER_NAME: 't', GIT_COMMITTER_EMAIL: 't@t', GIT_CONFIG_GLOBAL: '/dev/null' };
const gitIn = (cwd: string, ...args: string[]) => execFileSync('git', args, { cwd, env: GIT_ENV }).toString('utf8').trim();

beforeAll(async () => {
  t = await startTurnPlatform({ name: 'skill-proposals', env: { SKILL_SOURCES_ALLOW_LOCAL: '1', SKILL_ADOPTION_POLL_MS: '3600000' } });
  ({ p, api } = t);
  dir = mkdtempSync(join(tmpdir(), 'skill-source-'));
  bare = join(dir, 'skills.git');
  gitIn(dir, 'init', '--quiet', '--bare', '-b', 'main', bare);
  const work = join(dir, 'work');
  gitIn(dir, 'clone', '--quiet', bare, work);
  writeFileSync(join(work, 'README.md'), '# team skills\n');
  gitIn(work, 'add', '.');
  gitIn(work, 'commit', '--quiet', '-m', 'init');
  gitIn(work, 'push', '--quiet', 'origin', 'HEAD:main');
}, 180_000);
afterAll(async () => {
  await p?.stop();
  if (dir) rmSync(dir, { recursive: true, force: true });
});

type Proposal = Json & {
  id: string; status: string; version: number; verifications: Array<Json & { session: string; result: Json | null; source_version: number }>;
  skill?: Json & { name: string; content_sha256: string }; verification_material?: { task: string; rubric: string };
  submission?: Json & { branch: string; commit_sha: string }; adoption?: Json & { skill_id: string; skill_version: number };
  submission_attempt?: Json & { prepared_commit_sha: string; base_commit_sha: string }; error?: string; usage: Json & { total_tokens: number };
};

const CREATE = { 'service-version': '2026-08-29' };
const VERIFY_STATES = new Set(['verifying', 'verified', 'verification_failed']);
const PAST_AUTHORING = new Set(['drafted', 'verifying', 'verified', 'verification_failed', 'submitting', 'submitted']);

/** The resource's six consistency rules, as a client sees them. */
function checkRules(x: Proposal): void {
  const ctx = `${x.id} ${x.status}`;
  expect(x.error !== undefined, `${ctx}: rule 1`).toBe(x.status === 'authoring_failed' || (x.status === 'discarded' && x.skill === undefined && x.error !== undefined));
  if (PAST_AUTHORING.has(x.status)) expect(x.skill && x.verification_material, `${ctx}: rule 2`).toBeTruthy();
  if (x.status === 'authoring' || x.status === 'authoring_failed') expect(x.skill ?? x.verification_material, `${ctx}: rule 2`).toBeUndefined();
  if (x.status === 'submitting') expect(x.submission_attempt, `${ctx}: rule 3`).toBeDefined();
  if (x.submission_attempt) expect(['submitting', 'submitted'], `${ctx}: rule 3`).toContain(x.status);
  expect(x.submission !== undefined, `${ctx}: rule 4`).toBe(x.status === 'submitted');
  if (x.adoption) expect(x.status, `${ctx}: rule 5`).toBe('submitted');
  if (VERIFY_STATES.has(x.status)) expect(x.verifications.length, `${ctx}: rule 6`).toBeGreaterThan(0);
}

const read = async (id: string) => {
  const x = await api.get<Proposal>(`/v1/skill-proposals/${id}`);
  checkRules(x);
  return x;
};
const until = (id: string, what: string, ok: (x: Proposal) => boolean, ms = 120_000) =>
  waitFor(what, async () => {
    const x = await read(id);
    return ok(x) ? x : undefined;
  }, ms);

/** The agent of the source Sessions (and so of the verifications): it follows the house-greeting skill when it has it. */
const AGENT = SCRIPT([
  { when: { user_contains: 'Greet the visitor' }, then: [{ tool: 'skill', input: { name: 'house-greeting' } }] },
  { when: { after_tool: 'skill', tool_result_contains: 'GREETING-OK' }, then: [{ reply: 'GREETING-OK, Ada!' }] },
  { when: { after_tool: 'skill' }, then: [{ reply: 'I have no such skill.' }] },
  { then: [{ reply: 'Hello, {{user}}' }] },
]);

const rubric = (rules: unknown[]) => RUBRIC(rules, ['The answer greets with GREETING-OK and the name']);
const SATISFIED = rubric([{ when: { user_contains: 'GREETING-OK, Ada' }, then: [{ verdict: 'satisfied' }] }, { then: [{ verdict: 'needs_revision', explanation: 'no house greeting' }] }]);
const FAILING = rubric([{ then: [{ verdict: 'needs_revision', explanation: 'Not in the house style.' }] }]);

const authored = (r: string) => ({
  name: 'house-greeting', description: 'Greets visitors in the house style.', instructions: 'Greet with GREETING-OK followed by the visitor\'s name.',
  task: 'Greet the visitor named Ada.', rubric: r,
});

let agentId: string;
let sources: string[];

async function sourceSession(message: string): Promise<string> {
  const s = await api.post<{ id: string }>('/v1/sessions', { agent: agentId, environment_id: t.envId });
  await api.post(`/v1/sessions/${s.id}/events`, t.msg(message));
  await untilEvents(api, s.id, (e) => idleCount(e) >= 1, 120_000);
  return s.id;
}

const propose = (body: Json) => api.request<Proposal>('POST', '/v1/skill-proposals', { body, headers: CREATE });
const verify = (id: string, body: Json, idempotencyKey?: string) =>
  api.request<Proposal>('POST', `/v1/skill-proposals/${id}/verify`, { body, ...(idempotencyKey ? { headers: { 'idempotency-key': idempotencyKey } } : {}) });

describe('skill proposals', () => {
  beforeAll(async () => {
    agentId = (await api.post<{ id: string }>('/v1/agents', { name: 'greeter', model: 'default', system: AGENT })).id;
    sources = [await sourceSession('Please greet Bob at the door.'), await sourceSession('Please greet Carol at the door.')];
  }, 240_000);

  it('validates the create request', async () => {
    const stale = await api.request('POST', '/v1/skill-proposals', { body: { source_session_ids: sources, model_routing_profile_key: 'default' } });
    expect(stale.status).toBe(400);
    expect(errType(stale)).toBe('validation.malformed');
    for (const body of [
      { source_session_ids: [], model_routing_profile_key: 'default' },
      { source_session_ids: Array.from({ length: 9 }, () => sources[0]), model_routing_profile_key: 'default' },
      { source_session_ids: [sources[0], sources[0]], model_routing_profile_key: 'default' },
      { source_session_ids: sources },
      { source_session_ids: sources, model_routing_profile_key: 'default', instructions: '' },
      { source_session_ids: sources, model_routing_profile_key: 'default', instructions: 'x'.repeat(4097) },
      { source_session_ids: sources, model_routing_profile_key: 'default', skill_name: 'Not A Key' },
      { source_session_ids: sources, model_routing_profile_key: 'default', extra: true },
    ]) {
      const r = await propose(body);
      expect(r.status, JSON.stringify(body).slice(0, 120)).toBe(400);
      expect(errType(r)).toBe('validation.malformed');
    }
    const unknown = await propose({ source_session_ids: ['sess_' + '0'.repeat(32)], model_routing_profile_key: 'default' });
    expect(unknown.status).toBe(404);
    const noModel = await propose({ source_session_ids: sources, model_routing_profile_key: 'no-such-profile' });
    expect(noModel.status).toBe(422);
    expect(errType(noModel)).toBe('model.no_eligible_model');
  });

  it('authors, verifies (satisfied), resumes a retried verify without a second Session, submits, and is adopted after the merge', async () => {
    const created = await propose({ source_session_ids: sources, model_routing_profile_key: 'default', instructions: authorInstructions(authored(SATISFIED)) });
    expect(created.status).toBe(201);
    expect(created.body).toMatchObject({ status: 'authoring', source_session_ids: sources, agent: agentId, model_routing_profile_key: 'default', verifications: [] });
    expect(created.body.id).toMatch(/^skp_[0-9a-f]{32}$/);
    checkRules(created.body);
    const id = created.body.id;

    const drafted = await until(id, 'drafted', (x) => x.status !== 'authoring');
    expect(drafted.status).toBe('drafted');
    expect(drafted.skill).toMatchObject({ name: 'house-greeting', description: 'Greets visitors in the house style.', kind: 'instructional', entry: 'SKILL.md' });
    expect(drafted.skill?.content_sha256).toMatch(/^sha256:[0-9a-f]{64}$/);
    expect(drafted.verification_material).toEqual({ task: 'Greet the visitor named Ada.', rubric: SATISFIED });
    expect(drafted.usage.total_tokens).toBeGreaterThan(0);

    // Stale version: a conflict, not a transition.
    const stale = await verify(id, { expected_version: drafted.version - 1, principal: t.principal });
    expect(stale.status).toBe(409);
    expect(errType(stale)).toBe('validation.conflict');
    // Submit and discard-free paths that are not legal from drafted.
    const src = await api.post<{ id: string; default_branch: string }>('/v1/skill-sources', { name: 'team', url: bare });
    const early = await api.request('POST', `/v1/skill-proposals/${id}/submit`, { body: { expected_version: drafted.version, skill_source: src.id, principal: t.principal } });
    expect(early.status).toBe(409);
    expect(errType(early)).toBe('runtime.invalid_transition');

    // The first verify "times out" on the client; the same request again resumes it.
    const original = { expected_version: drafted.version, principal: t.principal };
    const key = 'verify-1';
    const ac = new AbortController();
    const lost = fetch(`${p.baseUrl}/v1/skill-proposals/${id}/verify`, {
      method: 'POST', signal: ac.signal, body: JSON.stringify(original), headers: { ...api.headers({ 'idempotency-key': key }, true) },
    }).catch(() => null);
    ac.abort();
    await lost;
    let resumed = await verify(id, original, key);
    while (resumed.status === 409 && errType(resumed) === 'idempotency.conflict') resumed = await verify(id, original, key);
    expect(resumed.status).toBe(200);
    checkRules(resumed.body);
    expect(resumed.body.verifications).toHaveLength(1);
    const attempt = resumed.body.verifications[0] as Proposal['verifications'][number];
    expect(attempt).toMatchObject({ source_version: drafted.version, principal: t.principal });
    expect(attempt.launched_at).not.toBeNull();
    // Without the key too: the attempt's request resumes; never a second Session.
    const again = await verify(id, original);
    expect(again.status).toBe(200);
    expect(again.body.verifications.map((v) => v.session)).toEqual([attempt.session]);

    const verified = await until(id, 'verified', (x) => x.status === 'verified' || x.status === 'verification_failed');
    expect(verified.status).toBe('verified');
    expect(verified.verifications).toHaveLength(1);
    expect(verified.verifications[0]?.result).toMatchObject({ verdict: 'satisfied' });
    expect(Number(verified.verifications[0]?.result?.cost_tokens)).toBeGreaterThan(0);
    // After the read reconciled the verdict (the version moved on), the exact original retry still answers.
    const after = await verify(id, original);
    expect(after.status).toBe(200);
    expect(after.body.status).toBe('verified');
    expect(after.body.verifications).toHaveLength(1);
    const replay = await verify(id, original, key);
    expect(replay.status).toBe(200);
    // A new verify of a verified proposal is not a legal transition.
    const illegal = await verify(id, { expected_version: verified.version, principal: t.principal });
    expect(illegal.status).toBe(409);
    expect(errType(illegal)).toBe('runtime.invalid_transition');

    // The verification Session: isolated (no source Session, no resource), the drafted skill opened, graded once.
    const vs = await api.get<Json & { resources: unknown[]; metadata: Json; outcome_evaluations: Json[] }>(`/v1/sessions/${attempt.session}`);
    expect(vs.resources).toEqual([]);
    expect(vs.metadata).toEqual({ skill_proposal_id: id });
    expect(vs.outcome_evaluations).toHaveLength(1);
    const vEvents = await untilEvents(api, attempt.session, (e) => e.some((x) => x.type === 'session.outcome_ended'), 30_000);
    expect(vEvents.filter((e) => e.type === 'agent.tool_use').map((e) => e.payload.name)).toEqual(['skill']);
    expect(JSON.stringify(vEvents)).not.toContain('Please greet Bob');
    const sessionsOfAgent = await api.get<{ data: Json[] }>(`/v1/sessions?agent_id=${agentId}&limit=100`);
    expect(sessionsOfAgent.data.filter((s) => (s.metadata as Json).skill_proposal_id === id)).toHaveLength(1);

    // Submit acts as an active Principal of this Workspace: an unknown one is 404 and records nothing.
    const stranger = await api.request('POST', `/v1/skill-proposals/${id}/submit`, { body: { expected_version: verified.version, skill_source: src.id, principal: `prin_${'0'.repeat(32)}` } });
    expect([stranger.status, errType(stranger)]).toEqual([404, 'validation.not_found']);
    expect(await read(id)).toMatchObject({ status: 'verified', version: verified.version });
    // Submit: the base must be what the caller expects (compare-and-swap).
    const head = gitIn(dir, '--git-dir', bare, 'rev-parse', 'refs/heads/main');
    const wrongBase = await api.request('POST', `/v1/skill-proposals/${id}/submit`, {
      body: { expected_version: verified.version, skill_source: src.id, principal: t.principal, expected_base_digest: `git-sha1:${'0'.repeat(40)}` },
    });
    expect(wrongBase.status).toBe(409);
    expect(errType(wrongBase)).toBe('validation.conflict');
    expect((await read(id)).status).toBe('verified');
    // A branch that already exists is never overwritten.
    gitIn(join(dir, 'work'), 'push', '--quiet', 'origin', 'HEAD:refs/heads/taken');
    const taken = await api.request('POST', `/v1/skill-proposals/${id}/submit`, { body: { expected_version: verified.version, skill_source: src.id, principal: t.principal, branch: 'taken' } });
    expect(taken.status).toBe(409);
    expect(errType(taken)).toBe('validation.conflict');
    expect(gitIn(dir, '--git-dir', bare, 'rev-parse', 'refs/heads/taken')).toBe(head);
    const stillVerified = await read(id);
    expect(stillVerified).toMatchObject({ status: 'verified', version: verified.version });
    expect(stillVerified.submission_attempt).toBeUndefined();
    const submitBody = { expected_version: verified.version, skill_source: src.id, principal: t.principal, expected_base_digest: `git-sha1:${head}` };
    // The source refuses the first push (a pre-receive hook): the attempt stays recorded, `submitting`.
    writeFileSync(join(bare, 'hooks', 'pre-receive'), '#!/bin/sh\nif [ -f reject-once ]; then rm -f reject-once; echo refused once >&2; exit 1; fi\nexit 0\n', { mode: 0o755 });
    writeFileSync(join(bare, 'reject-once'), '');
    const failed = await api.request('POST', `/v1/skill-proposals/${id}/submit`, { body: submitBody });
    expect(failed.status).toBe(500);
    expect(errType(failed)).toBe('runtime.internal');
    const pending = await read(id);
    expect(pending.status).toBe('submitting');
    expect(pending.submission_attempt).toMatchObject({ source_version: verified.version, base_commit_sha: head });
    expect(pending.submission).toBeUndefined();
    expect(() => gitIn(dir, '--git-dir', bare, 'rev-parse', '--verify', '--quiet', `refs/heads/${String(pending.submission_attempt?.branch)}`)).toThrow();
    // The same request again recovers: the recorded commit, made again exactly, is pushed.
    const submitted = await api.request<Proposal>('POST', `/v1/skill-proposals/${id}/submit`, { body: submitBody });
    expect(submitted.status).toBe(200);
    expect(submitted.body.submission?.commit_sha).toBe(pending.submission_attempt?.prepared_commit_sha);
    checkRules(submitted.body);
    expect(submitted.body.status).toBe('submitted');
    const sub = submitted.body.submission as NonNullable<Proposal['submission']>;
    expect(sub).toMatchObject({ skill_source: src.id });
    expect(submitted.body.submission_attempt).toMatchObject({
      source_version: verified.version, skill_source: src.id, acted_as: t.principal, branch: sub.branch, base_commit_sha: head,
      expected_base_digest: `git-sha1:${head}`, prepared_commit_sha: sub.commit_sha,
    });
    expect(submitted.body.submission_attempt?.base_content_sha256).toMatch(/^sha256:/);
    // Visible with git: the branch, its commit on top of main, the skill's file.
    expect(gitIn(dir, '--git-dir', bare, 'rev-parse', `refs/heads/${sub.branch}`)).toBe(sub.commit_sha);
    expect(gitIn(dir, '--git-dir', bare, 'rev-parse', `${sub.commit_sha}^`)).toBe(head);
    const file = gitIn(dir, '--git-dir', bare, 'show', `${sub.commit_sha}:skills/house-greeting/SKILL.md`);
    expect(file).toContain('name: house-greeting');
    expect(file).toContain('GREETING-OK');
    expect(gitIn(dir, '--git-dir', bare, 'rev-parse', 'refs/heads/main')).toBe(head);
    // The same submit again answers with the submitted proposal; nothing else is pushed.
    const resubmit = await api.request<Proposal>('POST', `/v1/skill-proposals/${id}/submit`, { body: submitBody });
    expect(resubmit.status).toBe(200);
    expect(resubmit.body.submission?.commit_sha).toBe(sub.commit_sha);
    for (const [path, body] of [['verify', { expected_version: submitted.body.version, principal: t.principal }], ['discard', { expected_version: submitted.body.version }]] as const) {
      const r = await api.request('POST', `/v1/skill-proposals/${id}/${path}`, { body });
      expect(r.status).toBe(409);
      expect(errType(r)).toBe('runtime.invalid_transition');
    }

    // Not adopted before the merge.
    expect((await api.post<{ adopted_skill_proposal_ids: string[] }>(`/v1/skill-sources/${src.id}/sync`, undefined)).adopted_skill_proposal_ids).toEqual([]);
    expect((await read(id)).adoption).toBeUndefined();
    const work = join(dir, 'work');
    gitIn(work, 'fetch', '--quiet', 'origin', sub.branch);
    gitIn(work, 'merge', '--quiet', '--ff-only', 'FETCH_HEAD');
    gitIn(work, 'push', '--quiet', 'origin', 'HEAD:main');
    const synced = await api.post<{ adopted_skill_proposal_ids: string[] }>(`/v1/skill-sources/${src.id}/sync`, undefined);
    expect(synced.adopted_skill_proposal_ids).toEqual([id]);
    const adopted = await read(id);
    expect(adopted.status).toBe('submitted');
    expect(adopted.adoption).toMatchObject({ skill_version: 1 });
    const skill = await api.get<Json & { name: string; latest: Json & { content_sha256: string; origin: string } }>(`/v1/skills/${adopted.adoption?.skill_id}`);
    expect(skill.name).toBe('house-greeting');
    expect(skill.latest.content_sha256).toBe(drafted.skill?.content_sha256);
    expect(skill.latest.origin).toBe('source');
  });

  it('a failing rubric ends verification_failed; verify again records a second attempt; then discard', async () => {
    const created = await propose({ source_session_ids: [sources[1]], model_routing_profile_key: 'default', instructions: authorInstructions(authored(FAILING)), skill_name: 'strict-greeting' });
    expect(created.status).toBe(201);
    const id = created.body.id;
    const drafted = await until(id, 'drafted', (x) => x.status !== 'authoring');
    expect(drafted.skill?.name).toBe('strict-greeting');
    const first = await verify(id, { expected_version: drafted.version, principal: t.principal });
    expect(first.status).toBe(200);
    const failed = await until(id, 'verification_failed', (x) => x.status === 'verification_failed' || x.status === 'verified');
    expect(failed.status).toBe('verification_failed');
    expect(failed.verifications[0]?.result).toMatchObject({ verdict: 'needs_revision', explanation: 'Not in the house style.' });
    const second = await verify(id, { expected_version: failed.version, principal: t.principal });
    expect(second.status).toBe(200);
    expect(second.body.verifications).toHaveLength(2);
    const failedAgain = await until(id, 'second verdict', (x) => x.status === 'verification_failed' && x.verifications.length === 2 && x.verifications[1]?.result !== null);
    expect(new Set(failedAgain.verifications.map((v) => v.session)).size).toBe(2);
    const submit = await api.request('POST', `/v1/skill-proposals/${id}/submit`, { body: { expected_version: failedAgain.version, skill_source: 'sksrc_' + '0'.repeat(32), principal: t.principal } });
    expect(submit.status).toBe(404);
    const discarded = await api.request<Proposal>('POST', `/v1/skill-proposals/${id}/discard`, { body: { expected_version: failedAgain.version } });
    expect(discarded.status).toBe(200);
    checkRules(discarded.body);
    expect(discarded.body.status).toBe('discarded');
    for (const [path, body] of [['verify', { expected_version: discarded.body.version, principal: t.principal }], ['discard', { expected_version: discarded.body.version }]] as const) {
      const r = await api.request('POST', `/v1/skill-proposals/${id}/${path}`, { body });
      expect(r.status).toBe(409);
      expect(errType(r)).toBe('runtime.invalid_transition');
    }
  });

  it('a verifying proposal takes no verify, submit or discard; erasing its verification Session fails the attempt', async () => {
    // The grader takes its time, so the proposal stays verifying while the requests arrive.
    const slow = rubric([{ then: [{ sleep_ms: 120_000 }, { verdict: 'satisfied' }] }]);
    const created = await propose({ source_session_ids: [sources[0]], model_routing_profile_key: 'default', instructions: authorInstructions(authored(slow)), skill_name: 'slow-greeting' });
    const drafted = await until(created.body.id, 'drafted', (x) => x.status !== 'authoring');
    const started = await verify(created.body.id, { expected_version: drafted.version, principal: t.principal });
    expect(started.body.status).toBe('verifying');
    const v = started.body.version;
    const src = await api.post<{ id: string }>('/v1/skill-sources', { name: 'slow', url: bare });
    for (const [path, body] of [
      ['verify', { expected_version: v, principal: t.principal }],
      ['submit', { expected_version: v, skill_source: src.id, principal: t.principal }],
      ['discard', { expected_version: v }],
    ] as const) {
      const r = await api.request('POST', `/v1/skill-proposals/${created.body.id}/${path}`, { body });
      expect({ path, status: r.status, type: errType(r) }).toEqual({ path, status: 409, type: 'runtime.invalid_transition' });
    }
    expect((await read(created.body.id)).status).toBe('verifying');
    const session = started.body.verifications[0]?.session as string;
    expect((await api.request('DELETE', `/v1/sessions/${session}`)).status).toBe(200);
    const failed = await until(created.body.id, 'verification_failed', (x) => x.status !== 'verifying');
    expect(failed.status).toBe('verification_failed');
    expect(failed.verifications[0]?.result).toMatchObject({ verdict: 'failed', explanation: 'the verification Session was erased' });
  });

  it('a verification Session that cannot start (the Agent was archived) ends the attempt verification_failed', async () => {
    const other = (await api.post<{ id: string }>('/v1/agents', { name: 'short-lived', model: 'default', system: AGENT })).id;
    const s = await api.post<{ id: string }>('/v1/sessions', { agent: other, environment_id: t.envId });
    const created = await propose({ source_session_ids: [s.id], model_routing_profile_key: 'default', instructions: authorInstructions(authored(SATISFIED)) });
    const drafted = await until(created.body.id, 'drafted', (x) => x.status !== 'authoring');
    expect(drafted.status).toBe('drafted');
    await api.post(`/v1/agents/${other}/archive`, undefined);
    const r = await verify(created.body.id, { expected_version: drafted.version, principal: t.principal });
    expect(r.status).toBe(200);
    checkRules(r.body);
    expect(r.body.status).toBe('verification_failed');
    expect(r.body.verifications[0]?.result).toMatchObject({ verdict: 'failed', cost_tokens: 0 });
    expect(String(r.body.verifications[0]?.result?.explanation)).toContain('runtime.invalid_transition');
  });

  it('authoring fails with the contract\'s error values: unusable answer, erased source, sources too large', async () => {
    const bad = await propose({ source_session_ids: [sources[0]], model_routing_profile_key: 'default', instructions: authorInstructions('this is not a skill') });
    const badDone = await until(bad.body.id, 'authoring_failed', (x) => x.status !== 'authoring');
    expect(badDone).toMatchObject({ status: 'authoring_failed', error: 'authoring_failed' });
    expect(badDone.skill).toBeUndefined();
    const v = await verify(bad.body.id, { expected_version: badDone.version, principal: t.principal });
    expect(v.status).toBe(409);
    expect(errType(v)).toBe('runtime.invalid_transition');

    const doomed = await sourceSession('Please greet Dan.');
    expect((await api.request('DELETE', `/v1/sessions/${doomed}`)).status).toBe(200);
    const erased = await propose({ source_session_ids: [sources[0], doomed], model_routing_profile_key: 'default', instructions: authorInstructions(authored(SATISFIED)) });
    expect(erased.status).toBe(201);
    expect(await until(erased.body.id, 'authoring_failed', (x) => x.status !== 'authoring')).toMatchObject({ status: 'authoring_failed', error: 'input_session_unavailable' });

    // One user message past the transcript budget (its agent answers briefly).
    const quiet = (await api.post<{ id: string }>('/v1/agents', { name: 'quiet', model: 'default', system: SCRIPT([{ then: [{ reply: 'ok' }] }]) })).id;
    const bigSession = await api.post<{ id: string }>('/v1/sessions', { agent: quiet, environment_id: t.envId });
    await api.post(`/v1/sessions/${bigSession.id}/events`, t.msg(`Please greet ${'Eve '.repeat(70_000)}`));
    await untilEvents(api, bigSession.id, (e) => idleCount(e) >= 1, 120_000);
    const big = bigSession.id;
    const large = await propose({ source_session_ids: [big], model_routing_profile_key: 'default', instructions: authorInstructions(authored(SATISFIED)) });
    expect(await until(large.body.id, 'authoring_failed', (x) => x.status !== 'authoring')).toMatchObject({ status: 'authoring_failed', error: 'input_sessions_too_large' });
    const discarded = await api.request<Proposal>('POST', `/v1/skill-proposals/${large.body.id}/discard`, { body: { expected_version: (await read(large.body.id)).version } });
    expect(discarded.status).toBe(200);
    checkRules(discarded.body);
    const list = await api.get<{ data: Proposal[] }>('/v1/skill-proposals?limit=100');
    for (const x of list.data) checkRules(x);
    expect(list.data.length).toBeGreaterThanOrEqual(5);
  }, 180_000);
});
