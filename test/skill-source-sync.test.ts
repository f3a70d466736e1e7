import { execFileSync } from 'node:child_process';
import { existsSync, mkdirSync, mkdtempSync, readdirSync, rmSync, unlinkSync, utimesSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, expect, it } from 'vitest';
import type { HttpClient } from '@agentplane/client';
import { waitFor, type Platform } from './harness/platform.js';
import { authorInstructions, idleCount, RUBRIC, SCRIPT, startTurnPlatform, untilEvents, type Json, type TurnPlatform } from './harness/turns.js';
import { errMsg, errType } from './harness/governance.js';

/**
 * Reading a skill source is bounded and adopting from it is idempotent:
 *
 * - a fetch takes the default branch's head without history and without file content, then only
 *   the files of the skill's own directory, none over the file limit: an object anywhere else in
 *   the repository (its history included) is never asked for, which a server that cannot send
 *   such an object shows, and an oversized file of the skill is refused without being fetched;
 * - any number of syncs of one source at once publish one Skill version for one content: the
 *   proposals adopted share it, a sync of unchanged content publishes nothing, changed content
 *   publishes exactly one more.
 */
let t: TurnPlatform; let p: Platform; let api: HttpClient; let dir: string; let scratchDir: string;
const GIT_ENV = { ...process.env, GIT_AUTHOR_NAME: 't', GIT_AUTHOR_EMAIL: 't@t', GIT_COMMITTER_NAME: 't', GIT_COMMITTER_EMAIL: 't@t', GIT_CONFIG_GLOBAL: '/dev/null', GIT_CONFIG_NOSYSTEM: '1' };
const gitIn = (cwd: string, ...args: string[]) => execFileSync('git', args, { cwd, env: GIT_ENV, maxBuffer: 64 << 20, stdio: ['ignore', 'pipe', 'pipe'] }).toString('utf8').trim();
const gitWith = (cwd: string, input: string, ...args: string[]) => execFileSync('git', args, { cwd, env: GIT_ENV, input, maxBuffer: 64 << 20 }).toString('utf8').trim();

interface Repo { bare: string; work: string }

/**
 * A bare repository serving partial fetches (filters allowed), its objects kept loose. `history`
 * is committed first and removed again, so it lives only in an older commit; `unsendable` names
 * files whose objects are then deleted from the server's store: any fetch that asks for them fails.
 */
function mkrepo(name: string, files: Record<string, string | Buffer>, options: { history?: Record<string, Buffer>; unsendable?: string[] } = {}): Repo {
  const bare = join(dir, `${name}.git`);
  gitIn(dir, 'init', '--quiet', '--bare', '-b', 'main', bare);
  gitIn(bare, 'config', 'uploadpack.allowFilter', 'true');
  gitIn(bare, 'config', 'receive.unpackLimit', '100000');
  const work = join(dir, `${name}-work`);
  gitIn(dir, 'clone', '--quiet', bare, work);
  const write = (entries: Record<string, string | Buffer>) => {
    for (const [k, v] of Object.entries(entries)) { mkdirSync(join(work, k, '..'), { recursive: true }); writeFileSync(join(work, k), v); }
  };
  const objectsOf = (paths: string[]) => paths.map((f) => gitIn(work, 'rev-parse', `HEAD:${f}`));
  let gone: string[] = [];
  if (options.history) {
    write(options.history);
    gitIn(work, 'add', '.'); gitIn(work, 'commit', '--quiet', '-m', 'history');
    gone = objectsOf(Object.keys(options.history));
    gitIn(work, 'rm', '--quiet', '-r', '--', ...Object.keys(options.history));
  }
  writeFileSync(join(work, 'README.md'), '# skills\n');
  write(files);
  gitIn(work, 'add', '.'); gitIn(work, 'commit', '--quiet', '-m', 'init'); gitIn(work, 'push', '--quiet', 'origin', 'HEAD:main');
  for (const object of [...gone, ...objectsOf(options.unsendable ?? [])]) {
    const loose = join(bare, 'objects', object.slice(0, 2), object.slice(2));
    expect(existsSync(loose), `${object} is a loose object of ${name}`).toBe(true);
    unlinkSync(loose);
  }
  return { bare, work };
}

/** A repository whose main holds `skills/<name>/` with `count` files: a listing far too long to read whole. */
function crowdedRepo(name: string, skill: string, count: number): string {
  const bare = join(dir, `${name}.git`);
  gitIn(dir, 'init', '--quiet', '--bare', '-b', 'main', bare);
  const blob = gitWith(bare, 'x\n', 'hash-object', '-w', '--stdin');
  const files = gitWith(bare, Array.from({ length: count }, (_, i) => `100644 blob ${blob}\tfile-${i}-of-a-directory-far-too-long-to-list.txt\n`).join(''), 'mktree');
  const skills = gitWith(bare, `040000 tree ${files}\t${skill}\n`, 'mktree');
  const root = gitWith(bare, `040000 tree ${skills}\tskills\n`, 'mktree');
  gitIn(bare, 'update-ref', 'refs/heads/main', gitIn(bare, 'commit-tree', root, '-m', 'crowded'));
  return bare;
}

/** Brings a submitted branch into the repository's main, as a reviewer's merge would. */
function merge(repo: Repo, branch: string): void {
  gitIn(repo.work, 'fetch', '--quiet', 'origin', branch);
  gitIn(repo.work, 'merge', '--quiet', '--ff-only', 'FETCH_HEAD');
  gitIn(repo.work, 'push', '--quiet', 'origin', 'HEAD:main');
}

beforeAll(async () => {
  dir = mkdtempSync(join(tmpdir(), 'skill-source-sync-'));
  // The api's scratch repositories are made here, so the test can see that none is left behind.
  scratchDir = join(dir, 'tmp');
  mkdirSync(scratchDir);
  // What a process killed mid-read leaves (untouched for two hours), beside a read of a live
  // process (just made): the api's start removes the first only.
  mkdirSync(join(scratchDir, 'agentplane-skill-source-killed', 'source.git'), { recursive: true });
  const twoHoursAgo = new Date(Date.now() - 2 * 3_600_000);
  utimesSync(join(scratchDir, 'agentplane-skill-source-killed'), twoHoursAgo, twoHoursAgo);
  mkdirSync(join(scratchDir, 'agentplane-skill-work-live'));
  t = await startTurnPlatform({ name: 'skill-source-sync', env: { SKILL_SOURCES_ALLOW_LOCAL: '1', SKILL_ADOPTION_POLL_MS: '3600000', TMPDIR: scratchDir } });
  ({ p, api } = t);
}, 180_000);
afterAll(async () => { await p?.stop(); if (dir) rmSync(dir, { recursive: true, force: true }); });

/** The verification agent: it follows the skill the task names when it has it. */
const AGENT = SCRIPT([
  { when: { user_contains: 'Greet the visitor' }, then: [{ tool: 'skill', input: { name: 'house-greeting' } }] },
  { when: { user_contains: 'Welcome the guest' }, then: [{ tool: 'skill', input: { name: 'bounded-skill' } }] },
  { when: { after_tool: 'skill', tool_result_contains: 'GREETING-OK' }, then: [{ reply: 'GREETING-OK, Ada!' }] },
  { then: [{ reply: 'Hello' }] },
]);
const rubric = (rules: unknown[]) => RUBRIC(rules, ['ok']);
const SATISFIED = rubric([{ when: { user_contains: 'GREETING-OK, Ada' }, then: [{ verdict: 'satisfied' }] }, { then: [{ verdict: 'needs_revision', explanation: 'no' }] }]);
type P = Json & {
  id: string; status: string; version: number; skill?: Json & { content_sha256: string };
  submission?: Json & { branch: string; commit_sha: string }; adoption?: Json & { skill_id: string; skill_version: number };
};
type SkillRead = Json & { latest_version: number; latest: Json & { content_sha256: string; origin: string } };

let agentId: string;
let sourceSession: string;

/** A verified proposal whose drafted skill is `name` with these instructions (the same arguments draft the same content). */
async function verifiedProposal(name: string, task: string, text: string): Promise<P> {
  if (!agentId) {
    agentId = (await api.post<{ id: string }>('/v1/agents', { name: 'greeter', model: 'default', system: AGENT })).id;
    const s = await api.post<{ id: string }>('/v1/sessions', { agent: agentId, environment_id: t.envId });
    await api.post(`/v1/sessions/${s.id}/events`, t.msg('Please greet Bob.'));
    await untilEvents(api, s.id, (e) => idleCount(e) >= 1, 120_000);
    sourceSession = s.id;
  }
  const created = await api.request<P>('POST', '/v1/skill-proposals', {
    body: { source_session_ids: [sourceSession], model_routing_profile_key: 'default', instructions: authorInstructions({ name, description: 'Greets visitors.', instructions: text, task, rubric: SATISFIED }) },
    headers: { 'service-version': '2026-08-29' },
  });
  expect(created.status).toBe(201);
  const id = created.body.id;
  const drafted = await waitFor('drafted', async () => { const x = await api.get<P>(`/v1/skill-proposals/${id}`); return x.status !== 'authoring' ? x : undefined; }, 120_000);
  expect(drafted.status).toBe('drafted');
  await api.post(`/v1/skill-proposals/${id}/verify`, { expected_version: drafted.version, principal: t.principal });
  const verified = await waitFor('verified', async () => { const x = await api.get<P>(`/v1/skill-proposals/${id}`); return x.status === 'verified' || x.status === 'verification_failed' ? x : undefined; }, 120_000);
  expect(verified.status).toBe('verified');
  return verified;
}

const submit = (x: P, source: string) => api.request<P>('POST', `/v1/skill-proposals/${x.id}/submit`, { body: { expected_version: x.version, skill_source: source, principal: t.principal } });
const sync = (source: string) => api.request<{ adopted_skill_proposal_ids: string[] }>('POST', `/v1/skill-sources/${source}/sync`);
const source = async (name: string, repo: Repo) => (await api.post<{ id: string }>('/v1/skill-sources', { name, url: repo.bare })).id;
const leftovers = () => readdirSync(scratchDir).filter((f) => f.startsWith('agentplane-skill-'));

it('the api\'s start removes the scratch directory a killed process left, and not a live one', async () => {
  await waitFor('the stale scratch directory removed', () => (existsSync(join(scratchDir, 'agentplane-skill-source-killed')) ? undefined : true), 30_000);
  expect(existsSync(join(scratchDir, 'agentplane-skill-work-live'))).toBe(true);
  rmSync(join(scratchDir, 'agentplane-skill-work-live'), { recursive: true });
});

it('fetches only the skill\'s own directory, without history, and no file over the limit', async () => {
  const proposal = await verifiedProposal('bounded-skill', 'Welcome the guest named Ada.', 'Greet with GREETING-OK and the name.');
  const history = { 'archive/old.bin': Buffer.alloc(64 << 10, 0x6f) };

  // An oversized file of the skill: refused (400, naming it) from the sizes the server reports by
  // leaving it out; the rest of the repository, which the server cannot send, is never asked for.
  const oversized = mkrepo('oversized', { 'skills/bounded-skill/huge.bin': Buffer.alloc(3 << 20, 0x61), 'assets/unsendable.bin': Buffer.alloc(64 << 10, 0x62) }, { history, unsendable: ['assets/unsendable.bin'] });
  const refused = await submit(proposal, await source('oversized', oversized));
  expect([refused.status, errType(refused)]).toEqual([400, 'validation.malformed']);
  expect(errMsg(refused)).toContain('huge.bin');
  expect((await api.get<P>(`/v1/skill-proposals/${proposal.id}`)).status).toBe('verified');

  // A skill directory whose listing alone is past anything git's output is read into: refused by its count.
  const crowded = await submit(proposal, (await api.post<{ id: string }>('/v1/skill-sources', { name: 'crowded', url: crowdedRepo('crowded', 'bounded-skill', 150_000) })).id);
  expect([crowded.status, errType(crowded)]).toEqual([400, 'validation.malformed']);
  expect(errMsg(crowded)).toContain('files');

  // A source whose other content (and history) cannot be sent: submitted, merged, adopted.
  const partial = mkrepo('partial', { 'assets/unsendable.bin': Buffer.alloc(64 << 10, 0x62), 'skills/other/SKILL.md': '---\nname: other\ndescription: x\n---\nx\n' }, { history, unsendable: ['assets/unsendable.bin', 'skills/other/SKILL.md'] });
  const partialId = await source('partial', partial);
  const submitted = await submit(proposal, partialId);
  expect([submitted.status, errMsg(submitted)]).toEqual([200, '']);
  expect(submitted.body.status).toBe('submitted');
  const branch = submitted.body.submission?.branch ?? '';
  expect(gitIn(partial.bare, 'show', `${branch}:skills/bounded-skill/SKILL.md`)).toContain('GREETING-OK');
  // The commit keeps the base's tree, the files it never fetched included.
  expect(gitIn(partial.bare, 'rev-parse', `${branch}:assets/unsendable.bin`)).toBe(gitIn(partial.work, 'rev-parse', 'HEAD:assets/unsendable.bin'));
  merge(partial, branch);
  const synced = await sync(partialId);
  expect([synced.status, synced.body.adopted_skill_proposal_ids]).toEqual([200, [proposal.id]]);
  const adopted = await api.get<P>(`/v1/skill-proposals/${proposal.id}`);
  expect(adopted.adoption?.skill_version).toBe(1);
  const skill = await api.get<SkillRead>(`/v1/skills/${adopted.adoption?.skill_id}`);
  expect(skill.latest.content_sha256).toBe(proposal.skill?.content_sha256);
  expect(leftovers()).toEqual([]);
}, 300_000);

it('publishes one Skill version however many syncs of the same content run at once', async () => {
  const text = 'Greet with GREETING-OK followed by the name.';
  const task = 'Greet the visitor named Ada.';
  // Two proposals drafting the same content, both submitted; one of them is merged.
  const [first, second] = [await verifiedProposal('house-greeting', task, text), await verifiedProposal('house-greeting', task, text)];
  expect(first.skill?.content_sha256).toBe(second.skill?.content_sha256);
  const repo = mkrepo('team', {});
  const src = await source('team', repo);
  const subs = [await submit(first, src), await submit(second, src)];
  expect(subs.map((r) => r.status)).toEqual([200, 200]);
  merge(repo, subs[0]?.body.submission?.branch ?? '');

  const syncs = await Promise.all(Array.from({ length: 12 }, () => sync(src)));
  expect(syncs.map((r) => r.status)).toEqual(syncs.map(() => 200));
  expect(new Set(syncs.flatMap((r) => r.body.adopted_skill_proposal_ids))).toEqual(new Set([first.id, second.id]));
  const adopted = await Promise.all([first, second].map((x) => api.get<P>(`/v1/skill-proposals/${x.id}`)));
  const skillId = adopted[0]?.adoption?.skill_id ?? '';
  expect(adopted.map((x) => x.adoption && [x.adoption.skill_id, x.adoption.skill_version])).toEqual([[skillId, 1], [skillId, 1]]);
  const one = await api.get<SkillRead>(`/v1/skills/${skillId}`);
  expect([one.latest_version, one.latest.content_sha256, one.latest.origin]).toEqual([1, first.skill?.content_sha256, 'source']);
  expect((await api.request('GET', `/v1/skills/${skillId}/versions/2`)).status).toBe(404);

  // Again, unchanged: nothing new.
  expect((await sync(src)).body.adopted_skill_proposal_ids).toEqual([]);
  expect((await api.get<SkillRead>(`/v1/skills/${skillId}`)).latest_version).toBe(1);

  // Changed content, merged: exactly one more version, whatever the number of syncs.
  const changed = await verifiedProposal('house-greeting', task, 'Greet with GREETING-OK, the name and a bow.');
  expect(changed.skill?.content_sha256).not.toBe(first.skill?.content_sha256);
  const sub = await submit(changed, src);
  expect(sub.status).toBe(200);
  merge(repo, sub.body.submission?.branch ?? '');
  const again = await Promise.all(Array.from({ length: 12 }, () => sync(src)));
  expect(again.map((r) => r.status)).toEqual(again.map(() => 200));
  expect(new Set(again.flatMap((r) => r.body.adopted_skill_proposal_ids))).toEqual(new Set([changed.id]));
  expect((await api.get<P>(`/v1/skill-proposals/${changed.id}`)).adoption).toMatchObject({ skill_id: skillId, skill_version: 2 });
  const two = await api.get<SkillRead>(`/v1/skills/${skillId}`);
  expect([two.latest_version, two.latest.content_sha256]).toEqual([2, changed.skill?.content_sha256]);
  expect((await api.request('GET', `/v1/skills/${skillId}/versions/3`)).status).toBe(404);
  expect(leftovers()).toEqual([]);
}, 400_000);
