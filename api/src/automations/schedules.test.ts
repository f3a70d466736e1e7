import { randomBytes } from 'node:crypto';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { useEmbeddedRedis } from '@agentplane/store/testing';
import { ApiError, createLogger, createMetrics, newId, nowIso, SecretBox } from '@agentplane/core';
import { DocumentStore, keys, tags, type Redis } from '@agentplane/store';
import { AutomationStore, automationKeys } from './store.js';
import { AutomationService, chainRefused, MAX_AUTOMATION_CHAIN, schedulerId } from './service.js';
import { firingsOf, publicAutomation, type AutomationDoc, type FiringDoc, type Trigger } from './model.js';

/**
 * Schedules against a real Redis and real BullMQ Job Schedulers: the time a tick was due, the
 * first tick of an interval, the scheduler following the document when writes race, and the
 * reconciliation of schedulers with schedule Automations. The firings' work is refused at
 * admission here (no Principal exists), which is enough to read their receipts.
 */
const testRedis = useEmbeddedRedis('automation-schedules');
let redis: Redis;
let store: AutomationStore;
let service: AutomationService;
const MISSED_AFTER_MS = 2000;

beforeAll(() => {
  redis = testRedis();
  store = new AutomationStore(redis, new DocumentStore(redis), new SecretBox(randomBytes(32)));
  service = new AutomationService({
    redisUrl: testRedis.server().url, store,
    sessions: {} as never, permissions: {} as never, policies: {} as never,
    identity: { activePrincipal: async () => { throw new ApiError('validation.not_found', 'principal not found'); } } as never,
    log: createLogger({ name: 'test', level: 'silent' }), metrics: createMetrics(),
    sweepIntervalMs: 600_000, tap: { on: () => undefined } as never, missedAfterMs: MISSED_AFTER_MS,
  });
});
afterAll(async () => {
  await service.close();
});

async function until<T>(what: string, probe: () => Promise<T | undefined>, timeoutMs = 30_000): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const v = await probe();
    if (v !== undefined) return v;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 50));
  }
}

async function automation(trigger: Trigger, over: Partial<AutomationDoc> = {}): Promise<AutomationDoc> {
  const now = nowIso();
  const a: AutomationDoc = {
    id: newId('automation'), type: 'automation', workspace_id: newId('workspace'), name: 'scheduled', status: 'active', principal_id: newId('principal'),
    agent: { id: newId('agent'), version: null }, environment_id: newId('environment'), prompt: 'tick {{event.scheduled_at}}', budget: null,
    max_concurrent_firings: 5, trigger, webhook: null, version: 1, created_at: now, updated_at: now, ...over,
  };
  await store.create(a, null);
  return a;
}

const cron = (pattern: string): Trigger => ({ type: 'schedule', cron: pattern, timezone: 'UTC', on_missed: 'fire_once' });
const scheduler = (id: string) => service.queue.getJobScheduler(schedulerId(id));
const setCron = (a: AutomationDoc, pattern: string) => store.update(a.workspace_id, a.id, (cur) => ({ ...cur, trigger: cron(pattern) }));

describe('ticks of an interval schedule', () => {
  it('carry the time each was due (the scheduler\'s next time), and are not missed fires when the period is longer than the missed threshold', async () => {
    const interval = 3;
    expect(interval * 1000).toBeGreaterThan(MISSED_AFTER_MS);
    const a = await automation({ type: 'schedule', interval_seconds: interval, on_missed: 'skip' });
    await service.syncSchedule(a.workspace_id, a.id);
    const first = Date.parse(String(await service.nextScheduledAt(a.id)));
    // The first tick is one interval after the scheduler was made, not at once.
    expect(first).toBeGreaterThanOrEqual(Date.parse(a.created_at) + interval * 1000);

    service.start();
    const firings = await until('two ticks', async () => {
      const page = await store.docs.list<FiringDoc>(tags.workspace(a.workspace_id), firingsOf(a.id), { limit: 10, order: 'asc' });
      return page.data.length >= 2 ? page.data : undefined;
    });
    expect(firings.map((f) => f.source)).toEqual([
      { kind: 'schedule', scheduled_at: new Date(first).toISOString() },
      { kind: 'schedule', scheduled_at: new Date(first + interval * 1000).toISOString() },
    ]);
    // `{{event}}` carries the same time.
    expect(firings[0]?._prompt).toBe(`tick ${new Date(first).toISOString()}`);
    // On time: admitted to the checks (refused there: no Principal), not skipped as missed.
    for (const f of firings) expect([f.status, f.error]).not.toEqual(['skipped', 'missed_schedule']);
    expect((await store.metrics(a.workspace_id, a.id)).skipped).toBe(0);
    await store.update(a.workspace_id, a.id, (cur) => ({ ...cur, status: 'paused' }));
    await service.syncSchedule(a.workspace_id, a.id);
    expect(await scheduler(a.id)).toBeUndefined();
  });
});

describe('ticks of a cron schedule', () => {
  it('come at the expression\'s times in its time zone, each next one made by the worker', async () => {
    const a = await automation({ type: 'schedule', cron: '*/2 * * * * *', timezone: 'America/Santiago', on_missed: 'fire_once' });
    await service.syncSchedule(a.workspace_id, a.id);
    const first = Date.parse(String(await service.nextScheduledAt(a.id)));
    expect(first % 2000).toBe(0);
    service.start();
    const firings = await until('three ticks', async () => {
      const page = await store.docs.list<FiringDoc>(tags.workspace(a.workspace_id), firingsOf(a.id), { limit: 10, order: 'asc' });
      return page.data.length >= 3 ? page.data : undefined;
    });
    // On the expression's even seconds, one of them at the time the scheduler named (the worker,
    // running since the test before, may take a tick between the schedule's write and the read of
    // its next time; a tick taken late on a loaded machine may let the next one fall on a later
    // even second).
    const due = firings.map((f) => Date.parse(String(f.source.scheduled_at)));
    expect(due).toContain(first);
    expect(due[0]).toBeGreaterThanOrEqual(Date.parse(a.created_at) - 2000);
    for (const [i, t] of due.entries()) {
      expect(t % 2000).toBe(0);
      if (i > 0) expect(t).toBeGreaterThan(due[i - 1]!);
    }
    await store.update(a.workspace_id, a.id, (cur) => ({ ...cur, status: 'paused' }));
    await service.syncSchedule(a.workspace_id, a.id);
  });
});

describe('a tick run again', () => {
  it('(its worker died mid-tick, its job stalled) finds the firing it made: one firing per due time', async () => {
    const a = await automation({ type: 'schedule', interval_seconds: 3600, on_missed: 'fire_once' });
    const due = Date.now();
    const job = { id: `repeat:${schedulerId(a.id)}:${due}`, timestamp: due, delay: 0, data: { workspace_id: a.workspace_id, automation_id: a.id } };
    const tick = (service as unknown as { tick(j: typeof job): Promise<void> }).tick.bind(service);
    await tick(job);
    await tick(job);
    const page = await store.docs.list<FiringDoc>(tags.workspace(a.workspace_id), firingsOf(a.id), { limit: 10, order: 'asc' });
    expect(page.data.map((f) => f.source)).toEqual([{ kind: 'schedule', scheduled_at: new Date(due).toISOString() }]);
    expect((await store.metrics(a.workspace_id, a.id)).fires).toBe(1);
    // The next due time is a firing of its own.
    await tick({ ...job, id: `repeat:${schedulerId(a.id)}:${due + 3_600_000}` });
    expect((await store.docs.list<FiringDoc>(tags.workspace(a.workspace_id), firingsOf(a.id), { limit: 10, order: 'asc' })).data).toHaveLength(2);
  });
});

describe('a tick of an earlier schedule', () => {
  const tickOf = (a: AutomationDoc, due: number) => {
    const job = { id: `repeat:${schedulerId(a.id)}:${due}`, timestamp: due, delay: 0, data: { workspace_id: a.workspace_id, automation_id: a.id } };
    return (service as unknown as { tick(j: typeof job): Promise<void> }).tick.call(service, job);
  };
  const fired = async (a: AutomationDoc) => (await store.docs.list<FiringDoc>(tags.workspace(a.workspace_id), firingsOf(a.id), { limit: 10, order: 'asc' })).data.map((f) => f.source.scheduled_at);

  it('queued before a pause and run after a quick resume does not fire beside the new schedule', async () => {
    const a = await automation({ type: 'schedule', interval_seconds: 3600, on_missed: 'fire_once' });
    const dueBefore = Date.now() - 1;
    // Still active: a tick due a moment ago fires (the same tick, below, does not once the schedule was paused and resumed).
    const twin = await automation({ type: 'schedule', interval_seconds: 3600, on_missed: 'fire_once' });
    await tickOf(twin, dueBefore);
    expect(await fired(twin)).toEqual([new Date(dueBefore).toISOString()]);

    const paused = await store.update(a.workspace_id, a.id, (cur) => ({ ...cur, status: 'paused' }));
    const resumed = await store.update(a.workspace_id, a.id, (cur) => ({ ...cur, status: 'active' }), paused.version);
    expect(resumed._schedule_since_ms).toBeGreaterThan(dueBefore);
    await tickOf(a, dueBefore);
    expect(await fired(a)).toEqual([]);
    // The resumed schedule's own ticks fire.
    const dueAfter = (resumed._schedule_since_ms as number) + 3_600_000;
    await tickOf(a, dueAfter);
    expect(await fired(a)).toEqual([new Date(dueAfter).toISOString()]);
  });

  it('made under times since changed is dropped; a change that keeps the times keeps its ticks', async () => {
    const a = await automation(cron('0 * * * *'));
    const due = Date.now() - 1;
    // A change of the prompt (or of on_missed) keeps the schedule's times: its pending tick fires.
    await store.update(a.workspace_id, a.id, (cur) => ({ ...cur, prompt: 'changed', trigger: { ...cron('0 * * * *'), on_missed: 'skip' } }));
    await tickOf(a, due);
    expect(await fired(a)).toEqual([new Date(due).toISOString()]);
    const due2 = Date.now() - 1;
    await setCron(a, '30 * * * *');
    await tickOf(a, due2);
    expect(await fired(a)).toEqual([new Date(due).toISOString()]);
  });

  it('is an internal mark: the Automation as shown does not carry it', async () => {
    const a = await automation({ type: 'schedule', interval_seconds: 60, on_missed: 'fire_once' });
    const paused = await store.update(a.workspace_id, a.id, (cur) => ({ ...cur, status: 'paused' }));
    const resumed = await store.update(a.workspace_id, a.id, (cur) => ({ ...cur, status: 'active' }), paused.version);
    expect(resumed._schedule_since_ms).toBeTypeOf('number');
    expect(Object.keys(publicAutomation(resumed))).not.toContain('_schedule_since_ms');
  });
});

describe('the scheduler follows the document', () => {
  it('when two changes race, the scheduler ends with the one stored last', async () => {
    const a = await automation(cron('0 1 * * *'));
    await service.syncSchedule(a.workspace_id, a.id);
    // Request 1 stores 02:00; just before it writes its scheduler, request 2 stores 03:00 and
    // writes its own: request 1's write lands last.
    await setCron(a, '0 2 * * *');
    const upsert = service.queue.upsertJobScheduler.bind(service.queue);
    let raced = false;
    service.queue.upsertJobScheduler = (async (...args: Parameters<typeof upsert>) => {
      if (!raced && args[0] === schedulerId(a.id)) {
        raced = true;
        await setCron(a, '0 3 * * *');
        await service.syncSchedule(a.workspace_id, a.id);
      }
      return upsert(...args);
    }) as typeof upsert;
    try {
      await service.syncSchedule(a.workspace_id, a.id);
    } finally {
      service.queue.upsertJobScheduler = upsert;
    }
    expect(raced).toBe(true);
    expect((await scheduler(a.id))?.pattern).toBe('0 3 * * *');
  });

  it('an update that leaves the schedule as it is keeps the scheduler\'s next time', async () => {
    const a = await automation({ type: 'schedule', interval_seconds: 3600, on_missed: 'fire_once' });
    await service.syncSchedule(a.workspace_id, a.id);
    const next = await service.nextScheduledAt(a.id);
    await store.update(a.workspace_id, a.id, (cur) => ({ ...cur, prompt: 'another prompt' }));
    await service.syncSchedule(a.workspace_id, a.id);
    expect(await service.nextScheduledAt(a.id)).toBe(next);
  });
});

describe('reconciliation of schedulers with schedule Automations', () => {
  it('makes a missing scheduler, corrects a stale one, and removes those of paused, deleted or unknown Automations', async () => {
    // A crash between the document and its scheduler: none was made.
    const missing = await automation(cron('0 4 * * *'));
    // A crash after a change of schedule: the scheduler runs the old one.
    const stale = await automation(cron('0 5 * * *'));
    await service.syncSchedule(stale.workspace_id, stale.id);
    await setCron(stale, '0 6 * * *');
    // A crash after a pause, and after a delete.
    const paused = await automation(cron('0 7 * * *'));
    await service.syncSchedule(paused.workspace_id, paused.id);
    await store.update(paused.workspace_id, paused.id, (cur) => ({ ...cur, status: 'paused' }));
    const deleted = await automation(cron('0 8 * * *'));
    await service.syncSchedule(deleted.workspace_id, deleted.id);
    await store.remove(deleted.workspace_id, deleted.id);
    // A scheduler no schedule Automation knows of.
    const orphanId = newId('automation');
    await service.queue.upsertJobScheduler(schedulerId(orphanId), { pattern: '0 9 * * *', tz: 'UTC' }, {
      name: 'tick', data: { workspace_id: newId('workspace'), automation_id: orphanId },
    });
    const unrelated = `other-${newId('event')}`;
    await service.queue.upsertJobScheduler(unrelated, { pattern: '0 9 * * *', tz: 'UTC' }, { name: 'other' });

    await service.reconcileSchedules();

    expect((await scheduler(missing.id))?.pattern).toBe('0 4 * * *');
    expect((await scheduler(stale.id))?.pattern).toBe('0 6 * * *');
    expect(await scheduler(paused.id)).toBeUndefined();
    expect(await scheduler(deleted.id)).toBeUndefined();
    expect(await scheduler(orphanId)).toBeUndefined();
    expect(await service.queue.getJobScheduler(unrelated)).toBeDefined();
    const members = await redis.smembers(automationKeys.schedules());
    expect(members).toEqual(expect.arrayContaining([`${missing.workspace_id}/${missing.id}`, `${paused.workspace_id}/${paused.id}`]));
    expect(members).not.toContain(`${deleted.workspace_id}/${deleted.id}`);
    // A paused Automation keeps its place: resuming it (or reconciling after) restores its scheduler.
    await store.update(paused.workspace_id, paused.id, (cur) => ({ ...cur, status: 'active' }));
    await service.reconcileSchedules();
    expect((await scheduler(paused.id))?.pattern).toBe('0 7 * * *');
    expect(await redis.exists(keys.doc(tags.workspace(deleted.workspace_id), deleted.id))).toBe(0);
  });
});

describe('chains of Automations', () => {
  it('refuses an Automation already in the chain, and a chain at its length limit', () => {
    expect(chainRefused([], 'auto_a')).toBe(false);
    expect(chainRefused(['auto_b'], 'auto_a')).toBe(false);
    expect(chainRefused(['auto_a', 'auto_b'], 'auto_a')).toBe(true);
    const long = Array.from({ length: MAX_AUTOMATION_CHAIN }, (_, i) => `auto_${i}`);
    expect(chainRefused(long.slice(1), 'auto_x')).toBe(false);
    expect(chainRefused(long, 'auto_x')).toBe(true);
  });
});
