import { afterEach, describe, expect, it } from 'vitest';
import { useEmbeddedRedis } from '@agentplane/store/testing';
import type { Job } from 'bullmq';
import { createLogger } from '@agentplane/core';
import { CancelMarks, DEFAULT_LEASE_CONFIG, LeaseFence, LeaseKeeper, RunQueues, type Lease, type LeaseConfig, type RunJobData, type RunnerCapabilities } from '@agentplane/lease';
import { keys, tags, type Redis } from '@agentplane/store';
import { PoolDispatcher, type DispatchHooks } from './dispatcher.js';
import type { LeaseOffer, OfferBody, OfferChannel, RunnerDirectory, RunnerView } from './directory.js';

const log = createLogger({ name: 'test', level: 'silent' });
const config: LeaseConfig = { ...DEFAULT_LEASE_CONFIG, leaseMs: 2000, heartbeatMs: 600, offerTimeoutMs: 500, stalledIntervalMs: 500, backoffMs: 100, fenceMarginMs: 300 };
const caps = (slots: number): RunnerCapabilities => ({
  available_slots: slots,
  providers: [{ id: 'docker', drivers: ['docker'], tiers: ['container'], network_modes: ['none'], maximum_resources: { memory_mib: 4096 } }],
});
const requirements = { tier: 'container', network_mode: 'none', resources: { cpu_millis: 500, memory_mib: 256, disk_mib: 100, max_duration_seconds: 60 } };

const testRedis = useEmbeddedRedis('sched');
const conn = (): Redis => testRedis.connect('test', { blocking: true });


/** Test runners that answer offers through the same LeaseKeeper API the gateway uses. */
class Fleet implements RunnerDirectory, OfferChannel {
  runners = new Map<string, { view: RunnerView; accept: boolean; leases: Lease[] }>();
  offers = 0;
  /** Runs while an offer is out, before the runner answers (an interrupt arriving then). */
  onOffer: ((o: LeaseOffer) => Promise<void>) | undefined;
  /** Runs once a runner's acceptance claimed the lease, before the dispatcher hears of it. */
  onAccepted: ((o: LeaseOffer) => Promise<void>) | undefined;
  constructor(private readonly keeper: LeaseKeeper, private readonly pool: string) {}
  add(id: string, slots = 1, accept = true, planes?: string[]): void {
    this.runners.set(id, { view: { runner_id: id, pool_id: this.pool, status: 'ready', capabilities: { ...caps(slots), ...(planes ? { plane_protocols: planes } : {}) } }, accept, leases: [] });
  }
  /** Offers sent ahead of their body, each with the body as it came. */
  ahead: { body: Promise<Record<string, unknown> | null> }[] = [];
  async live(): Promise<RunnerView[]> {
    return [...this.runners.values()].map((r) => r.view);
  }
  async enrolled(): Promise<RunnerCapabilities[]> {
    return [...this.runners.values()].map((r) => r.view.capabilities);
  }
  prepared = 0;
  prepare(): OfferBody {
    this.prepared++;
    return Promise.resolve({});
  }
  async offer(o: LeaseOffer, _timeoutMs: number, body: OfferBody, _node?: string, specFollows = false): Promise<'accepted' | 'rejected' | 'timeout' | 'withdrawn'> {
    if (specFollows) this.ahead.push({ body });
    else if ((await body) === null) return 'withdrawn';
    this.offers++;
    await this.onOffer?.(o);
    const r = this.runners.get(o.runner_id);
    if (!r || !r.accept) return 'rejected';
    const lease: Lease = { lease_id: o.lease_id, run_id: o.run_id, session_id: o.session_id, pool_id: o.pool_id, attempt: o.attempt, runner_id: o.runner_id };
    const res = await this.keeper.accept(lease);
    if (res !== 'ok') return 'rejected';
    r.leases.push(lease);
    r.view.capabilities.available_slots = (r.view.capabilities.available_slots ?? 1) - 1;
    await this.onAccepted?.(o);
    return 'accepted';
  }
}

const hooks = () => {
  const events: { kind: string; run: string; detail?: string }[] = [];
  const h: DispatchHooks = {
    leased: async (job: Job<RunJobData>, runner: string) => void events.push({ kind: 'leased', run: job.data.run_id, detail: runner }),
    waiting: async (job: Job<RunJobData>, reason: string) => void events.push({ kind: 'waiting', run: job.data.run_id, detail: reason }),
    stalled: async (run: string) => void events.push({ kind: 'stalled', run }),
    retaken: async (job: Job<RunJobData>) => void events.push({ kind: 'retaken', run: job.data.run_id, detail: String(job.attemptsStarted) }),
    exhausted: async (run: string) => void events.push({ kind: 'exhausted', run }),
    interrupted: async (job: Job<RunJobData>) => void events.push({ kind: 'interrupted', run: job.data.run_id }),
    cancelLease: async (job: Job<RunJobData>, runner: string) => void events.push({ kind: 'cancelLease', run: job.data.run_id, detail: runner }),
  };
  return { events, h };
};

async function until(what: string, fn: () => boolean | Promise<boolean>, ms = 15_000): Promise<void> {
  const end = Date.now() + ms;
  while (!(await fn())) {
    if (Date.now() > end) throw new Error(`timed out: ${what}`);
    await new Promise((r) => setTimeout(r, 25));
  }
}

let pool = 0;
let dispatchers: PoolDispatcher[] = [];
afterEach(async () => {
  await Promise.all(dispatchers.map((d) => d.stop()));
  dispatchers = [];
});

function setup(n = 1, cfg: LeaseConfig = config) {
  const poolId = `rpool_${String(++pool).padStart(32, '0')}`;
  const redis = conn();
  const queues = new RunQueues(redis, cfg);
  const fence = new LeaseFence(redis);
  const keeper = new LeaseKeeper(queues, fence, cfg);
  const fleet = new Fleet(keeper, poolId);
  const { events, h } = hooks();
  const cancels = new CancelMarks(redis);
  for (let i = 0; i < n; i++) {
    const d = new PoolDispatcher({ poolId, queues, connection: conn(), directory: fleet, offers: fleet, hooks: h, config: cfg, log, capacityRetryMs: 100, cancels });
    d.start();
    dispatchers.push(d);
  }
  const ids = (i: number) => ({ run: `run_${String(i).padStart(32, '0')}`, session: `sess_${String(i).padStart(32, '0')}` });
  // A Run's job is added once the Run is committed: a job without its Run is dropped (`phantom`).
  const job = (i: number, ws: string) => queues.enqueue({ run_id: ids(i).run, session_id: ids(i).session, thread_id: 'sthr_x', workspace_id: ws, pool_id: poolId, requirements, accepted_at_ms: Date.now() });
  const enqueue = async (i: number, ws = 'wrkspc_a', status = 'queued') => {
    await redis.set(keys.doc(tags.session(ids(i).session), ids(i).run), JSON.stringify({ id: ids(i).run, type: 'run', version: 1, status }));
    return job(i, ws);
  };
  const phantom = (i: number, ws = 'wrkspc_a') => job(i, ws);
  return { poolId, queues, fence, keeper, fleet, events, hooks: h, enqueue, phantom, cancels };
}

describe('lease engine (BullMQ)', () => {
  it('offers, leases, heartbeats and completes a Run', async () => {
    const s = setup();
    s.fleet.add('runner_a');
    await s.enqueue(1);
    await until('leased', () => s.events.some((e) => e.kind === 'leased'));
    const lease = s.fleet.runners.get('runner_a')?.leases[0] as Lease;
    expect(await s.fence.holds(lease.session_id, lease.lease_id)).toBe(true);
    expect(await s.keeper.heartbeat(lease)).toBe('ok');
    expect(await s.keeper.complete(lease, { ok: true })).toBe('ok');
    expect(await (await s.queues.job(s.poolId, lease.run_id))?.getState()).toBe('completed');
    expect(await s.fence.holds(lease.session_id, lease.lease_id)).toBe(false);
  });

  it('offers the runners with the most free slots first, at most MAX_OFFERS of them, and skips the full ones', async () => {
    const s = setup(1, { ...config, maxOffers: 2 });
    const offered: string[] = [];
    s.fleet.onOffer = async (o) => void offered.push(o.runner_id);
    // Ten runners: one full, one with four slots and one with three, both declining; the rest one slot.
    s.fleet.add('runner_full', 0);
    s.fleet.add('runner_four', 4, false);
    s.fleet.add('runner_three', 3, false);
    for (let i = 0; i < 7; i++) s.fleet.add(`runner_one_${i}`, 1);
    await s.enqueue(30);
    await until('two offers declined', () => offered.length >= 2);
    // The two best were offered, best first; both declined, so the Run waits for a later try
    // (a third offer would have gone to a one-slot runner, which accepts).
    expect(offered.slice(0, 2)).toEqual(['runner_four', 'runner_three']);
    await until('waiting', () => s.events.some((e) => e.kind === 'waiting' && e.detail === 'offered runners did not accept in time'));
    expect(s.events.some((e) => e.kind === 'leased')).toBe(false);
    // The declining runners leave: one-slot runners are offered next, in random order.
    s.fleet.runners.delete('runner_four');
    s.fleet.runners.delete('runner_three');
    await until('leased', () => s.events.some((e) => e.kind === 'leased'));
    const runner = s.events.find((e) => e.kind === 'leased')?.detail ?? '';
    expect(runner).toMatch(/^runner_one_/);
    expect(offered).not.toContain('runner_full');
  });

  it('a runner that stops heartbeating loses the lease; the Run is leased again elsewhere and the old token is dead', async () => {
    const s = setup();
    s.fleet.add('runner_a');
    await s.enqueue(2);
    await until('first lease', () => s.events.some((e) => e.kind === 'leased'));
    const stale = s.fleet.runners.get('runner_a')?.leases[0] as Lease;
    s.fleet.runners.delete('runner_a');
    s.fleet.add('runner_b');
    // The fence dies before the lock: no write window for the silent runner.
    await until('fence expiry', async () => !(await s.fence.holds(stale.session_id, stale.lease_id)), 5000);
    await until('stalled and leased again', () => s.events.filter((e) => e.kind === 'leased').length === 2);
    expect(s.events.some((e) => e.kind === 'stalled')).toBe(true);
    // Before the new attempt is offered, the hooks hear that the Run was taken again (where a
    // loss nobody recorded is repaired); the stall also stays on record in BullMQ's event stream.
    const second = s.events.findIndex((e, i) => e.kind === 'leased' && i > s.events.findIndex((x) => x.kind === 'leased'));
    const retaken = s.events.findLastIndex((e, i) => e.kind === 'retaken' && i < second);
    expect(retaken).toBeGreaterThanOrEqual(0);
    expect(Number(s.events[retaken]?.detail)).toBeGreaterThan(stale.attempt);
    expect((await s.queues.stalledAfter(s.poolId, '-')).runIds).toEqual([stale.run_id]);
    const fresh = s.fleet.runners.get('runner_b')?.leases[0] as Lease;
    expect(fresh.lease_id).not.toBe(stale.lease_id);
    expect(await s.keeper.heartbeat(stale)).toBe('lost');
    expect(await s.keeper.complete(stale, {})).toBe('lost');
    expect(await s.keeper.complete(fresh, {})).toBe('ok');
  });

  it('a Run that lost more leases than allowed is failed for good, not offered again', async () => {
    const s = setup(1, { ...config, maxStalledCount: 0 });
    s.fleet.add('runner_a');
    const { run_id: run } = await s.enqueue(6);
    await until('leased', () => s.events.some((e) => e.kind === 'leased'));
    s.fleet.runners.delete('runner_a');
    s.fleet.add('runner_b');
    await until('exhausted', () => s.events.some((e) => e.kind === 'exhausted' && e.run === run));
    await until('failed in BullMQ', async () => (await (await s.queues.job(s.poolId, run))?.getState()) === 'failed');
    expect(s.events.filter((e) => e.kind === 'leased')).toHaveLength(1);
    expect(s.fleet.runners.get('runner_b')?.leases).toHaveLength(0);
  });

  it('infrastructure failures retry with backoff; the agent’s own failures are final', async () => {
    const s = setup();
    s.fleet.add('runner_a', 2);
    await s.enqueue(3);
    await until('leased', () => s.events.some((e) => e.kind === 'leased'));
    const first = s.fleet.runners.get('runner_a')?.leases[0] as Lease;
    expect(await s.keeper.fail(first, { class: 'infrastructure', code: 'sandbox_start', message: 'sandbox failed to start' })).toBe('retry');
    await until('leased again', () => s.events.filter((e) => e.kind === 'leased').length === 2);
    const second = s.fleet.runners.get('runner_a')?.leases[1] as Lease;
    expect(second.attempt).toBeGreaterThan(first.attempt);
    expect(await s.keeper.fail(second, { class: 'agent', code: 'tool_crash', message: 'the agent failed' })).toBe('final');
    expect(await (await s.queues.job(s.poolId, second.run_id))?.getState()).toBe('failed');
  });

  it('waits visibly, saying why, when no runner can serve the Run and when all are busy', async () => {
    const s = setup();
    s.fleet.runners.set('tiny', { view: { runner_id: 'tiny', pool_id: s.poolId, status: 'ready', capabilities: { available_slots: 1, providers: [{ drivers: ['process'], tiers: ['process'], network_modes: ['host'] }] } }, accept: true, leases: [] });
    await s.enqueue(4);
    await until('waiting, unservable', () => s.events.some((e) => e.kind === 'waiting' && e.detail?.includes('no runner in the pool can serve')));
    expect(s.events.find((e) => e.kind === 'waiting')?.detail).toContain("tier 'container'");
    expect(await (await s.queues.job(s.poolId, `run_${String(4).padStart(32, '0')}`))?.getState()).not.toBe('failed');

    const t = setup();
    t.fleet.add('busy', 0);
    await t.enqueue(5);
    await until('waiting', () => t.events.some((e) => e.kind === 'waiting'));
    expect(t.events.some((e) => e.kind === 'leased')).toBe(false);
    (t.fleet.runners.get('busy') as { view: RunnerView }).view.capabilities.available_slots = 1;
    await until('leased once a slot frees', () => t.events.some((e) => e.kind === 'leased'));
  });

  it('a workspace with a backlog does not hold back another workspace’s single Run', async () => {
    const s = setup();
    for (let i = 0; i < 200; i++) await s.enqueue(1000 + i, 'wrkspc_big');
    await s.enqueue(9999, 'wrkspc_small');
    s.fleet.add('runner_a', 1);
    // Complete Runs as they come; record the order.
    const order: string[] = [];
    const runner = s.fleet.runners.get('runner_a') as { view: RunnerView; leases: Lease[] };
    await until('the small workspace ran', async () => {
      const l = runner.leases.shift();
      if (l) {
        order.push(l.run_id);
        await s.keeper.complete(l, {});
        runner.view.capabilities.available_slots = 1;
      }
      return order.includes(`run_${String(9999).padStart(32, '0')}`);
    });
    expect(order.length).toBeLessThanOrEqual(2);
  });

  it('two dispatchers never lease one Run twice', async () => {
    const s = setup(2);
    for (let i = 0; i < 10; i++) s.fleet.add(`runner_${i}`, 5);
    for (let i = 0; i < 40; i++) await s.enqueue(2000 + i);
    await until('all leased', () => s.events.filter((e) => e.kind === 'leased').length >= 40);
    await new Promise((r) => setTimeout(r, 500));
    const leased = s.events.filter((e) => e.kind === 'leased').map((e) => e.run);
    expect(leased).toHaveLength(40);
    expect(new Set(leased).size).toBe(40);
  });

  it('a first attempt goes to a lease-spec-v1 runner without waiting for its body, which follows; a later attempt carries it', async () => {
    const s = setup();
    s.fleet.add('runner_spec', 1, true, ['lease-spec-v1']);
    const { run_id: run } = await s.enqueue(2500);
    await until('leased', () => s.events.some((e) => e.kind === 'leased' && e.run === run));
    expect(s.fleet.ahead).toHaveLength(1);
    expect(await s.fleet.ahead[0]?.body).toEqual({});
    expect(s.fleet.prepared).toBe(1);
    // The lease is lost (no heartbeats): the next attempt's offer carries its body, whichever runner takes it.
    const lease = s.fleet.runners.get('runner_spec')?.leases[0] as Lease;
    expect(lease.attempt).toBe(1);
    s.fleet.add('runner_spec_b', 1, true, ['lease-spec-v1']);
    await until('leased again', () => s.events.filter((e) => e.kind === 'leased' && e.run === run).length >= 2, 15_000);
    expect(s.fleet.ahead).toHaveLength(1);
  });

  describe('a job whose Run was never committed (sent behind a start that did not commit)', () => {
    it('is dropped: never leased, offered ahead only with no body, and gone from the queue', async () => {
      const s = setup();
      s.fleet.add('runner_plain', 1);
      await s.phantom(3101);
      const run = `run_${String(3101).padStart(32, '0')}`;
      await until('dropped', () => s.events.some((e) => e.kind === 'interrupted' && e.run === run));
      expect(s.fleet.offers).toBe(0);
      expect(s.events.some((e) => e.kind === 'leased')).toBe(false);
      await until('the job gone', async () => (await s.queues.job(s.poolId, run)) === undefined);
      // A committed Run behind it is served as usual.
      await s.enqueue(3102);
      await until('the next leased', () => s.events.some((e) => e.kind === 'leased' && e.run === `run_${String(3102).padStart(32, '0')}`));
    });
  });

  describe('a job whose Run has ended (an interrupt recorded the end, then died before it removed the job)', () => {
    it('is dropped: never offered nor leased, and gone from the queue', async () => {
      const s = setup();
      s.fleet.add('runner_a');
      const { run_id: run } = await s.enqueue(3201, 'wrkspc_a', 'canceled');
      await until('dropped', () => s.events.some((e) => e.kind === 'interrupted' && e.run === run));
      await until('the job gone', async () => (await s.queues.job(s.poolId, run)) === undefined);
      expect(s.fleet.offers).toBe(0);
      expect(s.events.some((e) => e.kind === 'leased')).toBe(false);
    });
  });

  describe('an interrupt of a Run a dispatcher holds (cancel mark)', () => {
    it('marked as the Run goes back to the queue: the turn ends before the job goes, so a crash in between leaves the job to the next take, which ends it', async () => {
      const s = setup();
      // Nobody here can serve the Run: it waits, and goes back to the queue, marked meanwhile.
      s.fleet.runners.set('tiny', { view: { runner_id: 'tiny', pool_id: s.poolId, status: 'ready', capabilities: { available_slots: 1, providers: [{ drivers: ['process'], tiers: ['process'], network_modes: ['host'] }] } }, accept: true, leases: [] });
      const record = s.hooks.waiting;
      s.hooks.waiting = async (job, reason, trace) => {
        await record(job, reason, trace);
        await s.cancels.mark(job.data.session_id, job.data.run_id);
      };
      // The first end of the turn dies half way (the process crashed in it).
      const end = s.hooks.interrupted;
      let ends = 0;
      s.hooks.interrupted = async (job, trace) => {
        if (++ends === 1) throw new Error('crashed while ending the turn');
        await end(job, trace);
      };
      const { run_id: run, session_id: session } = await s.enqueue(3202);
      await until('the turn ended', () => s.events.some((e) => e.kind === 'interrupted' && e.run === run), 20_000);
      expect(ends).toBe(2);
      await until('the job gone', async () => (await s.queues.job(s.poolId, run)) === undefined);
      await until('the mark cleared', async () => !(await s.cancels.marked(session, run)));
      expect(s.fleet.offers).toBe(0);
    });

    it('a Run taken with a mark and offered ahead of its checks is never leased, and ends', async () => {
      const s = setup();
      s.fleet.add('runner_spec', 1, true, ['lease-spec-v1']);
      const run = `run_${String(3005).padStart(32, '0')}`;
      const session = `sess_${String(3005).padStart(32, '0')}`;
      await s.cancels.mark(session, run);
      await s.enqueue(3005);
      await until('interrupted', () => s.events.some((e) => e.kind === 'interrupted' && e.run === run));
      expect(s.fleet.ahead).toHaveLength(1);
      expect(await s.fleet.ahead[0]?.body).toBeNull();
      expect(s.fleet.runners.get('runner_spec')?.leases).toHaveLength(0);
      expect(s.events.some((e) => e.kind === 'leased')).toBe(false);
      await until('the mark cleared', async () => !(await s.cancels.marked(session, run)));
      expect(await s.queues.job(s.poolId, run)).toBeUndefined();
    });

    it('a Run taken with a mark ends without an offer and leaves the queue', async () => {
      const s = setup();
      s.fleet.add('runner_a');
      const run = `run_${String(3000).padStart(32, '0')}`;
      await s.cancels.mark(`sess_${String(3000).padStart(32, '0')}`, run);
      await s.enqueue(3000);
      await until('interrupted', () => s.events.some((e) => e.kind === 'interrupted' && e.run === run));
      // The turn ends first, then the job leaves the queue and the mark is cleared.
      await until('the mark cleared', async () => !(await s.cancels.marked(`sess_${String(3000).padStart(32, '0')}`, run)));
      expect(s.fleet.offers).toBe(0);
      expect(await s.queues.job(s.poolId, run)).toBeUndefined();
    });

    it('marked while the offer is out and declined: the Run ends when it goes back, and is not offered again', async () => {
      const s = setup();
      s.fleet.add('runner_a', 1, false);
      s.fleet.onOffer = (o) => s.cancels.mark(o.session_id, o.run_id);
      const { run_id: run, session_id: session } = await s.enqueue(3001);
      await until('interrupted', () => s.events.some((e) => e.kind === 'interrupted' && e.run === run));
      await until('the mark cleared', async () => !(await s.cancels.marked(session, run)));
      expect(await s.queues.job(s.poolId, run)).toBeUndefined();
      const offers = s.fleet.offers;
      await new Promise((r) => setTimeout(r, 300));
      expect(s.fleet.offers).toBe(offers);
      expect(s.events.filter((e) => e.kind === 'interrupted')).toHaveLength(1);
      expect(s.events.some((e) => e.kind === 'leased')).toBe(false);
    });

    it('marked while the offer is out, then accepted: the lease is never claimed and the Run ends', async () => {
      const s = setup();
      s.fleet.add('runner_a');
      let leaseId = '';
      s.fleet.onOffer = (o) => {
        leaseId = o.lease_id;
        return s.cancels.mark(o.session_id, o.run_id);
      };
      const { run_id: run, session_id: session } = await s.enqueue(3003);
      await until('interrupted', () => s.events.some((e) => e.kind === 'interrupted' && e.run === run));
      expect(s.fleet.runners.get('runner_a')?.leases).toHaveLength(0);
      expect(leaseId).not.toBe('');
      expect(await s.fence.holds(session, leaseId)).toBe(false);
      expect(s.events.some((e) => e.kind === 'leased' || e.kind === 'cancelLease')).toBe(false);
      // The turn ends first, then the job leaves the queue and the mark is cleared.
      await until('the mark cleared', async () => !(await s.cancels.marked(session, run)));
      expect(await s.queues.job(s.poolId, run)).toBeUndefined();
    });

    it('marked once the lease is claimed: the lease is cancelled on that runner, once, and the mark kept', async () => {
      const s = setup();
      s.fleet.add('runner_a');
      s.fleet.onAccepted = (o) => s.cancels.mark(o.session_id, o.run_id);
      const { run_id: run, session_id: session } = await s.enqueue(3002);
      await until('lease cancelled', () => s.events.some((e) => e.kind === 'cancelLease' && e.run === run));
      expect(s.events.filter((e) => e.kind === 'leased')).toHaveLength(1);
      expect(s.events.find((e) => e.kind === 'cancelLease')?.detail).toBe('runner_a');
      expect(s.events.some((e) => e.kind === 'interrupted')).toBe(false);
      // The mark stays: the lease's heartbeats find it should the lease.cancel be lost.
      expect(await s.cancels.marked(session, run)).toBe(true);
    });
  });
});

describe('a dispatcher stopped while it places a Run', () => {
  it('offers the Run to no other runner, gives it back to the queue, and has stopped only then', async () => {
    const s = setup();
    const d = dispatchers.at(-1) as PoolDispatcher;
    // Both decline; runner_a (more free slots) is offered first and answers once the stop began.
    s.fleet.add('runner_a', 2, false);
    s.fleet.add('runner_b', 1, false);
    let stopping: Promise<void> | undefined;
    let answer!: () => void;
    const answered = new Promise<void>((r) => (answer = r));
    let offeredAfterStop = 0;
    s.fleet.onOffer = async (o) => {
      if (stopping) {
        offeredAfterStop++;
        await stopping;
        return;
      }
      if (o.runner_id === 'runner_a') await answered;
    };
    const { run_id: run } = await s.enqueue(4001);
    await until('offered', () => s.fleet.offers === 1);
    stopping = d.stop();
    answer();
    await stopping;
    expect(offeredAfterStop).toBe(0);
    // Back in the queue for another scheduler, not held under a lock until it expires (a lost lease).
    expect(['wait', 'prioritized', 'delayed']).toContain(await (await s.queues.job(s.poolId, run))?.getState());
    expect(s.events.some((e) => e.kind === 'leased')).toBe(false);
  });
});

describe('an offer window longer than the lease', () => {
  it('the Run stays held while its offer is out, and a runner that answers late in the window takes it', async () => {
    // Settings the lease configuration accepts (LEASE_MS at its least, OFFER_TIMEOUT_MS above it).
    const cfg: LeaseConfig = { ...config, leaseMs: 2000, offerTimeoutMs: 8000, stalledIntervalMs: 250 };
    const s = setup(1, cfg);
    s.fleet.add('runner_a');
    // The runner answers once the lock the take started with would have expired unrenewed, and
    // BullMQ's stalled check has run since.
    s.fleet.onOffer = async () => {
      const offeredAt = Date.now();
      await until('a lease period passed', () => Date.now() - offeredAt > cfg.leaseMs + 2 * cfg.stalledIntervalMs);
    };
    const { run_id: run } = await s.enqueue(5001);
    await until('leased', () => s.events.some((e) => e.kind === 'leased' || e.kind === 'waiting'));
    expect(s.events.filter((e) => e.kind === 'leased')).toEqual([{ kind: 'leased', run, detail: 'runner_a' }]);
    expect(s.events.some((e) => e.kind === 'stalled')).toBe(false);
    expect(s.fleet.offers).toBe(1);
  });
});
