import { execFileSync } from 'node:child_process';
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, expect, it } from 'vitest';
import type { HttpClient } from '@agentplane/client';
import { waitFor, type Platform } from './harness/platform.js';
import { authorInstructions, idleCount, RUBRIC, SCRIPT, startTurnPlatform, untilEvents, type Json, type TurnPlatform } from './harness/turns.js';

let t: TurnPlatform; let p: Platform; let api: HttpClient; let dir: string;
const GIT_ENV = { ...process.env, GIT_AUTHOR_NAME: 't', GIT_AUTHOR_EMAIL: 't@t', GIT_COMMITTER_NAME: 't', GIT_COMMITTER_EMAIL: 't@t', GIT_CONFIG_GLOBAL: '/dev/null' };
const gitIn = (cwd: string, ...args: string[]) => execFileSync('git', args, { cwd, env: GIT_ENV, maxBuffer: 64 << 20 }).toString('utf8').trim();
function mkrepo(name: string, files: Record<string, string | Buffer>): string {
  const bare = join(dir, `${name}.git`);
  gitIn(dir, 'init', '--quiet', '--bare', '-b', 'main', bare);
  const work = join(dir, `${name}-work`);
  gitIn(dir, 'clone', '--quiet', bare, work);
  writeFileSync(join(work, 'README.md'), '# x\n');
  for (const [k, v] of Object.entries(files)) { mkdirSync(join(work, k, '..'), { recursive: true }); writeFileSync(join(work, k), v); }
  gitIn(work, 'add', '.'); gitIn(work, 'commit', '--quiet', '-m', 'init'); gitIn(work, 'push', '--quiet', 'origin', 'HEAD:main');
  return bare;
}
beforeAll(async () => {
  t = await startTurnPlatform({ name: 'skill-source-hostile', env: { SKILL_SOURCES_ALLOW_LOCAL: '1', SKILL_ADOPTION_POLL_MS: '3600000' } });
  ({ p, api } = t);
  dir = mkdtempSync(join(tmpdir(), 'skill-source-hostile-'));
}, 180_000);
afterAll(async () => { await p?.stop(); if (dir) rmSync(dir, { recursive: true, force: true }); });

const AGENT = SCRIPT([
  { when: { user_contains: 'Greet the visitor' }, then: [{ tool: 'skill', input: { name: 'house-greeting' } }] },
  { when: { after_tool: 'skill', tool_result_contains: 'GREETING-OK' }, then: [{ reply: 'GREETING-OK, Ada!' }] },
  { then: [{ reply: 'Hello' }] },
]);
const rubric = (rules: unknown[]) => RUBRIC(rules, ['ok']);
const SATISFIED = rubric([{ when: { user_contains: 'GREETING-OK, Ada' }, then: [{ verdict: 'satisfied' }] }, { then: [{ verdict: 'needs_revision', explanation: 'no' }] }]);
type P = Json & { id: string; status: string; version: number; submission?: Json & { branch: string; commit_sha: string }; adoption?: Json & { skill_id: string; skill_version: number } };

/**
 * A skill source is a repository someone else controls: a credential in its address, a
 * repository that is not there, huge or countless files are the source's fault, answered with
 * the catalog's 4xx, never read in full and never a 500.
 */
it('refuses what a hostile or broken skill source holds with a 4xx, before reading its content', async () => {
  // A credential in the address would be stored and shown to every reader of the source.
  const cred = await api.request<Json>('POST', '/v1/skill-sources', { body: { name: 'cred', url: 'https://x-access-token:ghp_SECRETSECRET@github.com/o/r.git' } });
  expect(cred.status).toBe(400);
  expect((cred.body as { error: { type: string } }).error.type).toBe('validation.malformed');
  expect(JSON.stringify(await api.get<Json>('/v1/skill-sources'))).not.toContain('ghp_SECRETSECRET');

  const agentId = (await api.post<{ id: string }>('/v1/agents', { name: 'greeter', model: 'default', system: AGENT })).id;
  const s = await api.post<{ id: string }>('/v1/sessions', { agent: agentId, environment_id: t.envId });
  await api.post(`/v1/sessions/${s.id}/events`, t.msg('Please greet Bob.'));
  await untilEvents(api, s.id, (e) => idleCount(e) >= 1, 120_000);
  const created = await api.request<P>('POST', '/v1/skill-proposals', { body: { source_session_ids: [s.id], model_routing_profile_key: 'default', instructions: authorInstructions({
    name: 'house-greeting', description: 'Greets visitors.', instructions: 'Greet with GREETING-OK and the name.', task: 'Greet the visitor named Ada.', rubric: SATISFIED }) }, headers: { 'service-version': '2026-08-29' } });
  const id = created.body.id;
  const drafted = await waitFor('drafted', async () => { const x = await api.get<P>(`/v1/skill-proposals/${id}`); return x.status !== 'authoring' ? x : undefined; }, 120_000);
  await api.post(`/v1/skill-proposals/${id}/verify`, { expected_version: drafted.version, principal: t.principal });
  const verified = await waitFor('verified', async () => { const x = await api.get<P>(`/v1/skill-proposals/${id}`); return x.status === 'verified' || x.status === 'verification_failed' ? x : undefined; }, 120_000);
  expect(verified.status).toBe('verified');
  const submit = (src: string) => api.request<P & { error?: { type: string; message: string } }>('POST', `/v1/skill-proposals/${id}/submit`, { body: { expected_version: verified.version, skill_source: src, principal: t.principal } });

  // A repository that is not there: the source's fault (409), not an incident.
  const missing = await api.post<{ id: string }>('/v1/skill-sources', { name: 'missing', url: join(dir, 'nope.git') });
  const r1 = await submit(missing.id);
  expect([r1.status, r1.body.error?.type]).toEqual([409, 'validation.conflict']);
  expect(r1.body.error?.message).toContain('could not be read');

  // A file past the limit (9 MiB; git's output buffer holds 8): refused by the listing's size.
  const big = mkrepo('big', { 'skills/house-greeting/big.bin': Buffer.alloc(9 << 20, 0x61) });
  const r2 = await submit((await api.post<{ id: string }>('/v1/skill-sources', { name: 'big', url: big })).id);
  expect([r2.status, r2.body.error?.type]).toEqual([400, 'validation.malformed']);
  expect(r2.body.error?.message).toContain('big.bin');

  // Countless files: refused by the listing's count, without reading them.
  const files: Record<string, string> = {};
  for (let i = 0; i < 600; i++) files[`skills/house-greeting/f${i}.txt`] = `x${i}`;
  const many = mkrepo('many', files);
  const r3 = await submit((await api.post<{ id: string }>('/v1/skill-sources', { name: 'many', url: many })).id);
  expect([r3.status, r3.body.error?.type]).toEqual([400, 'validation.malformed']);
  expect(r3.body.error?.message).toContain('files');

  // The proposal is still verified: nothing was submitted.
  expect((await api.get<P>(`/v1/skill-proposals/${id}`)).status).toBe('verified');
}, 300_000);
