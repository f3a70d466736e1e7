import { createHash } from 'node:crypto';
import { existsSync, rmSync } from 'node:fs';
import { describe, expect, it } from 'vitest';
import { useCrashPlatforms } from './harness/crash-platform.js';
import { errType } from './harness/governance.js';

interface Version { version: number; content_sha256: string }
interface Skill { id: string; name: string; latest_version: number; archived_at: string | null; latest: Version }

const skillMd = (body: string) => `---\nname: crashy\ndescription: Survives a crash.\n---\n\n${body}\n`;
const files = (body: string) => ({ files: [{ path: 'SKILL.md', content: skillMd(body) }] });

/**
 * The API killed inside a skill publish, after the script that appends the version and before
 * the head moves to it (crash point `skill-version-appended`). The version is kept and the head
 * brought up to it by the next read or publish; the same publish again, with or without its
 * Idempotency-Key, answers that version instead of appending a copy; other content still makes
 * exactly one new version. (Before, the version stayed out of sight, the Skill of a first version
 * had no head at all, and a retry appended the same content again.)
 */
describe('a crash between a skill version\'s append and its head', () => {
  const crash = useCrashPlatforms('skills-publish-crash');

  it('leaves exactly one new version, which reads and retries find', async () => {
    const q = await crash.start(['skill-version-appended'], { env: { LOG_LEVEL: 'warn' } });
    const c = q.p.root;
    const ws = q.p.bootstrap.workspace_id;
    const redis = q.redis();
    const marker = q.marker('skill-version-appended');
    const restarted = (before: number | undefined) => q.apiRestarted(before, { client: c, path: '/v1/skills' });
    const versionsOf = (id: string) => redis.hlen(`ap:{k:${id}}:versions`);
    const publish = (body: string, idempotencyKey?: string) => c.request<Skill>('POST', '/v1/skills', { body: files(body), ...(idempotencyKey ? { idempotencyKey } : {}) });
    const dies = async (body: string, idempotencyKey?: string) => {
      if (existsSync(marker)) rmSync(marker);
      const before = q.p.pids().api;
      await expect(publish(body, idempotencyKey)).rejects.toThrow();
      expect(existsSync(marker)).toBe(true);
      await restarted(before);
    };

    // A first version: the API dies before the Skill has a head.
    await dies('Version one.');
    const id = (await redis.hget(`ap:{w:${ws}}:uniq:skills`, 'crashy')) ?? '';
    expect(id).toMatch(/^skill_/);
    expect(await versionsOf(id)).toBe(1);
    // The same publish again, without a key: that version, not a copy of it.
    const first = await publish('Version one.');
    expect([first.status, first.body.id, first.body.latest_version, first.body.latest.version]).toEqual([201, id, 1, 1]);
    expect(await versionsOf(id)).toBe(1);
    expect((await c.get<{ data: Skill[] }>('/v1/skills')).data.map((s) => [s.id, s.latest_version])).toEqual([[id, 1]]);

    // The next version, under an Idempotency-Key: the API dies before the head moves.
    await dies('Version two.', 'publish-two');
    expect(await versionsOf(id)).toBe(2);
    // A read brings the head up to it.
    const read = await c.get<Skill>(`/v1/skills/${id}`);
    expect([read.latest_version, read.latest.version]).toEqual([2, 2]);
    const two = read.latest.content_sha256;
    // The retry under the same key: refused while the dead request's record is pending, which
    // frees the key a minute later (freed here now); then it answers that version, not a copy.
    const idemKey = `ap:{w:${ws}}:idem:${createHash('sha256').update('publish-two').digest('hex')}`;
    const pending = await publish('Version two.', 'publish-two');
    expect([pending.status, errType(pending)]).toEqual([409, 'idempotency.conflict']);
    expect(await redis.del(idemKey)).toBe(1);
    const retried = await publish('Version two.', 'publish-two');
    expect([retried.status, retried.body.latest_version, retried.body.latest.version, retried.body.latest.content_sha256]).toEqual([201, 2, 2, two]);
    expect(await versionsOf(id)).toBe(2);
    // And is replayed as stored from then on.
    const replayed = await publish('Version two.', 'publish-two');
    expect([replayed.status, replayed.headers.get('idempotent-replayed'), replayed.body.latest.version]).toEqual([201, 'true', 2]);

    // A version the head shows is not reused: the same content published again is a new version.
    const again = await publish('Version two.');
    expect([again.status, again.body.latest_version]).toEqual([201, 3]);

    // Cut short again; then other content, with no read in between: the cut-short version is
    // kept as it was and the new content is the one version after it.
    await dies('Version four.');
    const next = await publish('Version five.');
    expect([next.status, next.body.latest_version]).toEqual([201, 5]);
    expect(await versionsOf(id)).toBe(5);
    const four = await c.get<Version & { description: string }>(`/v1/skills/${id}/versions/4`);
    const fourFiles = await c.get<{ files: { content_base64: string }[] }>(`/v1/skills/${id}/versions/4/files`);
    expect(four.version).toBe(4);
    expect(Buffer.from(fourFiles.files[0]?.content_base64 ?? '', 'base64').toString('utf8')).toBe(skillMd('Version four.'));
  }, 240_000);
});
