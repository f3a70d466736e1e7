import { execFileSync } from 'node:child_process';
import { existsSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { waitFor } from './harness/platform.js';
import { useCrashPlatforms, type CrashTurnPlatform } from './harness/crash-platform.js';
import { authorInstructions, idleCount, RUBRIC, SCRIPT, untilEvents, type Json } from './harness/turns.js';

/**
 * The API killed as a submission is recorded `submitted` (crash point `skill-proposal-submitted`):
 * the source is still watched for the merge, so the proposal is adopted once its branch is merged
 * into the default branch, with nobody calling `…/sync` and nobody retrying the submit.
 */
const crash = useCrashPlatforms('skp-submit-crash');
let t: CrashTurnPlatform;
let dir: string;
let bare: string;

const GIT_ENV = { ...process.env, GIT_AUTHOR_NAME: 't', GIT_AUTHOR_EMAIL: 't@t', GIT_COMMITTER_NAME: 't', GIT_COMMITTER_EMAIL: 't@t', GIT_CONFIG_GLOBAL: '/dev/null' };
const gitIn = (cwd: string, ...args: string[]) => execFileSync('git', args, { cwd, env: GIT_ENV }).toString('utf8').trim();

const CREATE = { 'service-version': '2026-08-29' };
type Proposal = Json & { id: string; status: string; version: number; submission?: Json & { branch: string }; adoption?: Json & { skill_id: string } };

beforeAll(async () => {
  t = await crash.startTurn(['skill-proposal-submitted'], { name: 'skp-submit-crash', env: { SKILL_SOURCES_ALLOW_LOCAL: '1', SKILL_ADOPTION_POLL_MS: '1000', LOG_LEVEL: 'warn' } });
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
afterAll(() => {
  if (dir) rmSync(dir, { recursive: true, force: true });
});

describe('a crash as a skill proposal is recorded submitted', () => {
  it('still adopts the skill once the submission is merged', async () => {
    const { api } = t;
    const read = (id: string) => api.get<Proposal>(`/v1/skill-proposals/${id}`);
    const agent = (await api.post<{ id: string }>('/v1/agents', { name: 'greeter', model: 'default', system: SCRIPT([{ then: [{ reply: 'Hello, Ada' }] }]) })).id;
    const source = (await api.post<{ id: string }>('/v1/sessions', { agent, environment_id: t.envId })).id;
    await api.post(`/v1/sessions/${source}/events`, t.msg('Please greet Bob.'));
    await untilEvents(api, source, (e) => idleCount(e) >= 1, 120_000);
    const answer = {
      name: 'crash-greeting', description: 'Greets visitors.', instructions: 'Greet by name.', task: 'Greet the visitor named Ada.',
      rubric: RUBRIC([{ then: [{ verdict: 'satisfied' }] }]),
    };
    const created = await api.request<Proposal>('POST', '/v1/skill-proposals', {
      body: { source_session_ids: [source], model_routing_profile_key: 'default', instructions: authorInstructions(answer) }, headers: CREATE,
    });
    expect(created.status).toBe(201);
    const id = created.body.id;
    const drafted = await waitFor('the proposal authored', async () => {
      const x = await read(id);
      return x.status !== 'authoring' ? x : undefined;
    }, 60_000);
    expect(drafted.status).toBe('drafted');
    expect((await api.request('POST', `/v1/skill-proposals/${id}/verify`, { body: { expected_version: drafted.version, principal: t.principal } })).status).toBe(200);
    const verified = await waitFor('verified', async () => {
      const x = await read(id);
      return x.status === 'verified' || x.status === 'verification_failed' ? x : undefined;
    }, 120_000);
    expect(verified.status).toBe('verified');
    const src = await api.post<{ id: string }>('/v1/skill-sources', { name: 'team', url: bare });

    const before = t.p.pids().api;
    await expect(api.request('POST', `/v1/skill-proposals/${id}/submit`, { body: { expected_version: verified.version, skill_source: src.id, principal: t.principal } })).rejects.toThrow();
    expect(existsSync(t.marker('skill-proposal-submitted'))).toBe(true);
    await t.apiRestarted(before, { client: api, path: `/v1/skill-proposals/${id}` });
    const submitted = await read(id);
    expect(submitted.status).toBe('submitted');
    const branch = submitted.submission?.branch ?? '';

    // The branch is merged; nobody syncs the source nor retries the submit.
    const work = join(dir, 'work');
    gitIn(work, 'fetch', '--quiet', 'origin', branch);
    gitIn(work, 'merge', '--quiet', '--ff-only', 'FETCH_HEAD');
    gitIn(work, 'push', '--quiet', 'origin', 'HEAD:main');
    const adopted = await waitFor('the adoption', async () => {
      const x = await read(id);
      return x.adoption ? x : undefined;
    }, 60_000);
    expect(adopted.adoption).toMatchObject({ skill_version: 1 });
    expect((await api.get<{ name: string }>(`/v1/skills/${adopted.adoption?.skill_id}`)).name).toBe('crash-greeting');
  }, 360_000);
});
