import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { useEmbeddedRedis } from '@agentplane/store/testing';
import { Redis } from 'ioredis';
import { AuditLog, type NewAuditRecord } from './store.js';

let redis: Redis;
const DAY = 24 * 3600 * 1000;
const ws = () => `wrkspc_${Math.random().toString(16).slice(2).padEnd(32, '0').slice(0, 32)}`;
const rec = (action: string): NewAuditRecord => ({
  actor: { id: 'key_1', credential_id: 'key_1' }, action, target: null, outcome: 'succeeded', status: 200, detail: null, request_id: null,
});

const testRedis = useEmbeddedRedis('audit');
beforeAll(async () => {
  redis = new Redis(testRedis.server().url);
});
afterAll(async () => {
  redis?.disconnect();
});

describe('audit log store', () => {
  it('numbers records 1, 2, 3 and pages them by `after`', async () => {
    const log = new AuditLog(redis, 30 * DAY);
    const w = ws();
    for (let i = 0; i < 5; i++) expect(await log.append(w, rec(`a${i}`))).toBe(i + 1);
    const first = await log.export(w, { after: 0, limit: 2 });
    expect(first.data.map((r) => r.id)).toEqual([1, 2]);
    // The record reads back whole, its id and Workspace beside what was appended.
    expect(first.data[0]).toEqual({ ...rec('a0'), id: 1, workspace_id: w, time: expect.stringMatching(/^\d{4}-\d\d-\d\dT/) });
    expect(first.next_after).toBe(2);
    const rest = await log.export(w, { after: 2, limit: 10 });
    expect(rest.data.map((r) => r.action)).toEqual(['a2', 'a3', 'a4']);
    expect(rest.next_after).toBeNull();
  });

  it('drops records older than the retention window as new ones arrive; ids never repeat', async () => {
    const log = new AuditLog(redis, DAY);
    const w = ws();
    const t0 = Date.now() - 10 * DAY;
    for (let i = 0; i < 20; i++) await log.append(w, rec(`old${i}`), t0 + i);
    await log.append(w, rec('new0'));
    await log.append(w, rec('new1'));
    const page = await log.export(w, { after: 0, limit: 100 });
    expect(page.data.map((r) => r.action)).toEqual(['new0', 'new1']);
    expect(page.data.map((r) => r.id)).toEqual([21, 22]);
  });

  it('a filter that skips most entries still advances the cursor', async () => {
    const log = new AuditLog(redis, 30 * DAY);
    const w = ws();
    for (let i = 0; i < 1200; i++) await log.append(w, rec(i === 1100 ? 'needle' : 'hay'));
    const page = await log.export(w, { after: 0, limit: 5, action: 'needle' });
    expect(page.data.map((r) => r.id)).toEqual([1101]);
    expect(page.next_after).toBeNull();
  });

  it('records appended in one tick go in one script, numbered in call order, batches capped', async () => {
    const log = new AuditLog(redis, 30 * DAY);
    const [a, b] = [ws(), ws()];
    const calls = async () => Number(/cmdstat_evalsha:calls=(\d+)/.exec(await redis.info('commandstats'))?.[1] ?? 0);
    const before = await calls();
    // 70 records of one Workspace and 3 of another, all in the same tick.
    const ids = await Promise.all([
      ...Array.from({ length: 70 }, (_, i) => log.append(a, rec(`a${i}`))),
      ...Array.from({ length: 3 }, (_, i) => log.append(b, rec(`b${i}`))),
    ]);
    expect(ids).toEqual([...Array.from({ length: 70 }, (_, i) => i + 1), 1, 2, 3]);
    // 64 + 6 for the first Workspace, 3 for the other: three scripts, not 73.
    expect((await calls()) - before).toBe(3);
    const page = await log.export(a, { after: 0, limit: 100 });
    expect(page.data.map((r) => [r.id, r.action])).toEqual(Array.from({ length: 70 }, (_, i) => [i + 1, `a${i}`]));
    // The next tick's record follows the batch's.
    expect(await log.append(a, rec('later'))).toBe(71);
  });

  it('a batch that cannot be stored refuses every record in it, and stores none', async () => {
    // A client that is not connected and does not queue: every command is refused at once.
    const lost = new Redis(testRedis.server().url, { maxRetriesPerRequest: 0, enableOfflineQueue: false, lazyConnect: true });
    lost.on('error', () => undefined);
    const log = new AuditLog(lost, 30 * DAY);
    const w = ws();
    const results = await Promise.allSettled([log.append(w, rec('x')), log.append(w, rec('y'))]);
    expect(results.map((r) => r.status)).toEqual(['rejected', 'rejected']);
    lost.disconnect();
    expect((await new AuditLog(redis, 30 * DAY).export(w, { after: 0, limit: 10 })).data).toEqual([]);
  });

  it('a record that cannot be encoded is refused alone, as a rejected promise', async () => {
    const log = new AuditLog(redis, 30 * DAY);
    const w = ws();
    const [ok, bad] = await Promise.allSettled([log.append(w, rec('fine')), log.append(w, rec('bad'), Number.NaN)]);
    expect([ok.status, bad.status]).toEqual(['fulfilled', 'rejected']);
    expect((await log.export(w, { after: 0, limit: 10 })).data.map((r) => r.action)).toEqual(['fine']);
  });
});
