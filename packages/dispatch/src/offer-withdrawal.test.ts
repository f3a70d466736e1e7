import { afterEach, describe, expect, it } from 'vitest';
import { useEmbeddedRedis } from '@agentplane/store/testing';
import type { Job } from 'bullmq';
import { createLogger } from '@agentplane/core';
import { gatewayNodeChannel, type NodeDelivery } from '@agentplane/gateway';
import {
  CancelMarks, DEFAULT_LEASE_CONFIG, LeaseFence, LeaseKeeper, LeaseRecords, RunQueues, type LeaseConfig, type OfferReply, type RunJobData, type RunnerCapabilities,
} from '@agentplane/lease';
import { keys, tags, type Redis } from '@agentplane/store';
import { PoolDispatcher, type DispatchHooks } from './dispatcher.js';
import type { RunnerDirectory, RunnerView } from './directory.js';
import { RedisOfferChannel } from './offer-channel.js';

/**
 * A runner's acceptance that reaches the control plane after the scheduler gave up on its offer
 * (the offer timed out): the scheduler's withdrawal and the acceptance's claim meet in one script,
 * so either the offer counts as accepted, or the late acceptance is refused. The Run is leased to
 * one runner, never to the late one while the scheduler offers it elsewhere or gives it back.
 *
 * The real dispatcher and offer channel, over a real Redis; the gateway node is a stand-in that
 * takes the offers off its node channel and accepts them as the gateway does (the lease record
 * read when the frame arrives, then the lock extended and the fence claimed, then the answer).
 */
const log = createLogger({ name: 'test', level: 'silent' });
const config: LeaseConfig = { ...DEFAULT_LEASE_CONFIG, leaseMs: 4000, heartbeatMs: 1000, offerTimeoutMs: 400, stalledIntervalMs: 1000, backoffMs: 100, fenceMarginMs: 300 };
const LATE = 'offered runners did not accept in time';
const caps = (slots: number): RunnerCapabilities => ({
  available_slots: slots,
  providers: [{ id: 'docker', drivers: ['docker'], tiers: ['container'], network_modes: ['none'], maximum_resources: { memory_mib: 4096 } }],
});
const requirements = { tier: 'container', network_mode: 'none', resources: { cpu_millis: 500, memory_mib: 256, disk_mib: 100, max_duration_seconds: 60 } };

type Entry =
  | { kind: 'offer'; runner: string; lease: string }
  | { kind: 'accept'; runner: string; lease: string; outcome: string }
  | { kind: 'withdrawing'; runner: string; lease: string }
  | { kind: 'leased'; runner: string; lease: string }
  | { kind: 'waiting'; reason: string }
  | { kind: 'error'; message: string };

/** What happened, in order, and a wait for the next entry of a kind (no polling, no sleeps). */
class Journal {
  readonly entries: Entry[] = [];
  private readonly waiters: { match: (e: Entry) => boolean; resolve: (e: Entry) => void }[] = [];

  push(e: Entry): void {
    this.entries.push(e);
    for (const w of [...this.waiters]) {
      if (!w.match(e)) continue;
      this.waiters.splice(this.waiters.indexOf(w), 1);
      w.resolve(e);
    }
  }

  /** The first entry that matches, already written or still to come. */
  next<E extends Entry>(match: (e: Entry) => e is E): Promise<E>;
  next(match: (e: Entry) => boolean): Promise<Entry>;
  next(match: (e: Entry) => boolean): Promise<Entry> {
    const found = this.entries.find(match);
    if (found) return Promise.resolve(found);
    return new Promise((resolve) => this.waiters.push({ match, resolve }));
  }

  of<K extends Entry['kind']>(kind: K): Extract<Entry, { kind: K }>[] {
    return this.entries.filter((e): e is Extract<Entry, { kind: K }> => e.kind === kind);
  }
}

const isAccept = (runner: string, lease?: string) => (e: Entry): e is Extract<Entry, { kind: 'accept' }> =>
  e.kind === 'accept' && e.runner === runner && (lease === undefined || e.lease === lease);
const isOffer = (runner: string) => (e: Entry): e is Extract<Entry, { kind: 'offer' }> => e.kind === 'offer' && e.runner === runner;
/** The placement's end: a lease, or the Run given back (or something broke). */
const isSettled = (e: Entry): boolean => e.kind === 'leased' || (e.kind === 'waiting' && e.reason === LATE) || e.kind === 'error';

const testRedis = useEmbeddedRedis('withdrawal');
const conn = (): Redis => testRedis.connect('test', { blocking: true });
const closers: (() => Promise<void>)[] = [];

afterEach(async () => {
  for (const close of closers.splice(0).reverse()) await close();
});

/**
 * How a stand-in runner answers an offer: `accept` is its acceptance, already under way (the
 * gateway read the offer's record when the frame came); calling it extends the lock and claims.
 */
type Runner = (lease: string, accept: () => Promise<string>) => Promise<void>;

let n = 0;
async function setup(runners: Record<string, { slots: number; answer: Runner }>) {
  const i = ++n;
  const poolId = `rpool_${String(i).padStart(32, '0')}`;
  const runId = `run_${String(i).padStart(32, '0')}`;
  const sessionId = `sess_${String(i).padStart(32, '0')}`;
  const nodeId = `gwnode_${i}`;
  const journal = new Journal();
  const redis = conn();
  const queues = new RunQueues(redis, config);
  const fence = new LeaseFence(redis);
  const keeper = new LeaseKeeper(queues, fence, config);
  const records = new LeaseRecords(redis);

  const views: RunnerView[] = Object.entries(runners).map(([id, r]) => ({ runner_id: id, pool_id: poolId, status: 'ready', capabilities: caps(r.slots), node_id: nodeId }));
  const directory: RunnerDirectory = { live: async () => views, enrolled: async () => views.map((v) => v.capabilities) };

  // The gateway node: an offer's record is read as its frame arrives; the acceptance then extends
  // the lock and claims the fence (`LeaseKeeper.accept`) and answers the scheduler, as the gateway does.
  const node = conn();
  await node.subscribe(gatewayNodeChannel(nodeId));
  const acceptance = async (runnerId: string, leaseId: string): Promise<() => Promise<string>> => {
    const rec = await records.get(leaseId);
    return async () => {
      if (!rec || rec.runner_id !== runnerId) return 'unknown';
      const outcome = await keeper.accept({ lease_id: rec.lease_id, run_id: rec.run_id, session_id: rec.session_id, pool_id: rec.pool_id, attempt: rec.attempt, runner_id: rec.runner_id });
      if (outcome !== 'ok') await records.removeOffer(rec.lease_id, rec.runner_id);
      const reply: OfferReply = outcome === 'ok'
        ? { lease_id: rec.lease_id, runner_id: rec.runner_id, outcome: 'accepted', recorded: true }
        : { lease_id: rec.lease_id, runner_id: rec.runner_id, outcome: 'rejected', reason: outcome };
      await redis.publish(rec.reply_to, JSON.stringify(reply));
      journal.push({ kind: 'accept', runner: runnerId, lease: leaseId, outcome });
      return outcome;
    };
  };
  node.on('message', (_channel: string, message: string) => {
    const d = JSON.parse(message) as NodeDelivery;
    const f = JSON.parse(d.frame) as { type: string; payload: { lease_id: string } };
    if (f.type !== 'lease.offer') return;
    const lease = f.payload.lease_id;
    journal.push({ kind: 'offer', runner: d.runner_id, lease });
    void acceptance(d.runner_id, lease)
      .then((accept) => runners[d.runner_id]?.answer(lease, accept))
      .catch((err: unknown) => journal.push({ kind: 'error', message: err instanceof Error ? err.message : String(err) }));
  });

  const channelRedis = conn();
  const replies = conn();
  const channel = new RedisOfferChannel(channelRedis, replies, `sched_${i}`, records, async () => ({}), log);
  await channel.start();

  const hooks: DispatchHooks = {
    leased: async (job: Job<RunJobData>, runner: string, lease: string) => void journal.push({ kind: 'leased', runner, lease }),
    waiting: async (_job: Job<RunJobData>, reason: string) => void journal.push({ kind: 'waiting', reason }),
    stalled: async () => undefined,
    retaken: async () => undefined,
    exhausted: async () => undefined,
    interrupted: async () => undefined,
    cancelLease: async () => undefined,
  };
  const dispatcher = new PoolDispatcher({ poolId, queues, connection: conn(), directory, offers: channel, hooks, config, log, capacityRetryMs: 100, cancels: new CancelMarks(redis) });
  closers.push(async () => {
    await dispatcher.stop();
    channel.close();
    await node.unsubscribe();
    await queues.close();
  });
  const start = async () => {
    await redis.set(keys.doc(tags.session(sessionId), runId), JSON.stringify({ id: runId, type: 'run', version: 1, status: 'queued' }));
    await queues.enqueue({ run_id: runId, session_id: sessionId, thread_id: 'sthr_x', workspace_id: 'wrkspc_a', pool_id: poolId, requirements, accepted_at_ms: Date.now() });
    dispatcher.start();
  };
  return { journal, fence, queues, hooks, channelRedis, poolId, runId, sessionId, start };
}

describe('an offer that timed out while its acceptance was on its way', () => {
  it('the acceptance comes as the next runner is offered the same lease: it is refused, and the next runner takes the lease', async () => {
    const s = await setup({
      // Most free slots: offered first. Its acceptance is held until the scheduler moved on.
      runner_a: {
        slots: 2,
        answer: async (_lease, accept) => {
          await s.journal.next(isOffer('runner_b'));
          await accept();
        },
      },
      // Accepts once the late acceptance was answered (its refusal's answer reached the scheduler first).
      runner_b: {
        slots: 1,
        answer: async (_lease, accept) => {
          await s.journal.next(isAccept('runner_a'));
          await accept();
        },
      },
    });
    await s.start();
    const settled = await s.journal.next(isSettled);
    // The late acceptance was made before runner_b answered, so before the placement settled.
    const late = s.journal.of('accept').find((e) => e.runner === 'runner_a');
    expect(late?.outcome).toBe('taken');
    const lease = late?.lease ?? '';
    expect(settled).toEqual({ kind: 'leased', runner: 'runner_b', lease });
    expect(await s.journal.next(isAccept('runner_b'))).toMatchObject({ lease, outcome: 'ok' });
    // One lease, runner_b's, under the token the scheduler offered both runners.
    expect(s.journal.of('leased')).toHaveLength(1);
    expect(s.journal.of('waiting')).toEqual([]);
    expect(await s.fence.current(s.sessionId, s.runId)).toMatchObject({ token: lease, runner_id: 'runner_b' });
    const job = await s.queues.job(s.poolId, s.runId);
    expect(await job?.getState()).toBe('active');
    expect(s.journal.of('error')).toEqual([]);
  }, 20_000);

  it('the acceptance comes as the Run goes back to the queue: it is refused, and the Run is leased once, on a later take', async () => {
    let offers = 0;
    const s = await setup({
      runner_a: {
        slots: 1,
        answer: async (_lease, accept) => {
          // The first offer's acceptance arrives once the scheduler has given up on every runner
          // (the Run waits), before the job goes back: the hook below holds it until then.
          if (++offers === 1) await s.journal.next((e) => e.kind === 'waiting' && e.reason === LATE);
          await accept();
        },
      },
    });
    const waiting = s.hooks.waiting;
    s.hooks.waiting = async (job, reason, trace) => {
      await waiting(job, reason, trace);
      if (reason === LATE && s.journal.of('accept').length === 0) await s.journal.next(isAccept('runner_a'));
    };
    await s.start();
    const late = await s.journal.next(isAccept('runner_a'));
    expect(late.outcome).toBe('taken');
    expect(await s.fence.holds(s.sessionId, late.lease)).toBe(false);
    // The job went back under the first token; a later take offers it again, under a new one.
    const leased = await s.journal.next((e): e is Extract<Entry, { kind: 'leased' }> => e.kind === 'leased');
    expect(leased.runner).toBe('runner_a');
    expect(leased.lease).not.toBe(late.lease);
    expect(s.journal.of('accept').map((e) => e.outcome)).toEqual(['taken', 'ok']);
    expect(s.journal.of('leased')).toHaveLength(1);
    expect(await s.fence.current(s.sessionId, s.runId)).toMatchObject({ token: leased.lease, runner_id: 'runner_a' });
    expect(await s.fence.holds(s.sessionId, late.lease)).toBe(false);
    expect(s.journal.of('error')).toEqual([]);
  }, 20_000);

  it('the acceptance\'s claim lands between the timeout and the withdrawal: the offer counts as accepted, and no other runner is offered the Run', async () => {
    const s = await setup({
      // Answers only as the scheduler withdraws its offer (below): the claim comes first.
      runner_a: {
        slots: 2,
        answer: async (lease, accept) => {
          await s.journal.next((e) => e.kind === 'withdrawing' && e.lease === lease);
          await accept();
        },
      },
      runner_b: {
        slots: 1,
        answer: async (_lease, accept) => {
          await accept();
        },
      },
    });
    // The withdrawal's script, on its way from the scheduler, is held until the acceptance claimed.
    const evalsha = s.channelRedis.evalsha.bind(s.channelRedis) as (...args: unknown[]) => Promise<unknown>;
    Object.assign(s.channelRedis, {
      evalsha: async (...args: unknown[]) => {
        const withdrawing = args.find((a) => typeof a === 'string' && a.includes(':offer_withdrawn:')) as string | undefined;
        if (withdrawing && args.includes('runner_a')) {
          const lease = withdrawing.slice(withdrawing.indexOf(':offer_withdrawn:') + ':offer_withdrawn:'.length);
          s.journal.push({ kind: 'withdrawing', runner: 'runner_a', lease });
          await s.journal.next(isAccept('runner_a', lease));
        }
        return evalsha(...args);
      },
    });
    await s.start();
    const settled = await s.journal.next(isSettled);
    expect(settled).toMatchObject({ kind: 'leased', runner: 'runner_a' });
    const accepted = await s.journal.next(isAccept('runner_a'));
    expect(accepted.outcome).toBe('ok');
    expect(settled).toEqual({ kind: 'leased', runner: 'runner_a', lease: accepted.lease });
    expect(s.journal.of('offer').map((e) => e.runner)).toEqual(['runner_a']);
    expect(s.journal.of('leased')).toHaveLength(1);
    expect(await s.fence.current(s.sessionId, s.runId)).toMatchObject({ token: accepted.lease, runner_id: 'runner_a' });
    expect(s.journal.of('error')).toEqual([]);
  }, 20_000);
});

describe('an offer refused for its runner while the runner\'s acceptance was on its way', () => {
  /**
   * The gateway answers for a runner that connects again without naming an offer it was sent (its
   * connect check finds the offer's fence unclaimed, and refuses it so that the scheduler offers it
   * elsewhere), while the runner's acceptance of that offer is on its way: the gateway read the
   * offer's record as the acceptance came, and claims once the scheduler moved on.
   */
  const refusedFor = async (s: { channelRedis: Redis }, runner: string, lease: string) => {
    const reply: OfferReply = { lease_id: lease, runner_id: runner, outcome: 'rejected', reason: 'the runner restarted without this lease' };
    const replyTo = (await new LeaseRecords(s.channelRedis).get(lease))?.reply_to ?? '';
    await s.channelRedis.publish(replyTo, JSON.stringify(reply));
  };

  it('the acceptance comes as the next runner is offered the same lease: it is refused, and the next runner takes the lease', async () => {
    const s = await setup({
      runner_a: {
        slots: 2,
        answer: async (lease, accept) => {
          await refusedFor(s, 'runner_a', lease);
          await s.journal.next(isOffer('runner_b'));
          await accept();
        },
      },
      runner_b: {
        slots: 1,
        answer: async (_lease, accept) => {
          await s.journal.next(isAccept('runner_a'));
          await accept();
        },
      },
    });
    await s.start();
    const settled = await s.journal.next(isSettled);
    const late = s.journal.of('accept').find((e) => e.runner === 'runner_a');
    expect(late?.outcome).toBe('taken');
    const lease = late?.lease ?? '';
    expect(settled).toEqual({ kind: 'leased', runner: 'runner_b', lease });
    expect(await s.journal.next(isAccept('runner_b'))).toMatchObject({ lease, outcome: 'ok' });
    expect(s.journal.of('leased')).toHaveLength(1);
    expect(await s.fence.current(s.sessionId, s.runId)).toMatchObject({ token: lease, runner_id: 'runner_b' });
    expect(s.journal.of('error')).toEqual([]);
  }, 20_000);

  it('the acceptance comes as the Run goes back to the queue: it is refused, and the Run is leased once, on a later take', async () => {
    let offers = 0;
    const s = await setup({
      runner_a: {
        slots: 1,
        answer: async (lease, accept) => {
          if (++offers === 1) {
            await refusedFor(s, 'runner_a', lease);
            await s.journal.next((e) => e.kind === 'waiting' && e.reason === LATE);
          }
          await accept();
        },
      },
    });
    const waiting = s.hooks.waiting;
    s.hooks.waiting = async (job, reason, trace) => {
      await waiting(job, reason, trace);
      if (reason === LATE && s.journal.of('accept').length === 0) await s.journal.next(isAccept('runner_a'));
    };
    await s.start();
    const late = await s.journal.next(isAccept('runner_a'));
    expect(late.outcome).toBe('taken');
    const leased = await s.journal.next((e): e is Extract<Entry, { kind: 'leased' }> => e.kind === 'leased');
    expect(leased.runner).toBe('runner_a');
    expect(leased.lease).not.toBe(late.lease);
    expect(s.journal.of('accept').map((e) => e.outcome)).toEqual(['taken', 'ok']);
    expect(s.journal.of('leased')).toHaveLength(1);
    expect(await s.fence.current(s.sessionId, s.runId)).toMatchObject({ token: leased.lease, runner_id: 'runner_a' });
    expect(s.journal.of('error')).toEqual([]);
  }, 20_000);

  it('the acceptance\'s claim lands before the refusal is settled: the offer counts as accepted, and no other runner is offered the Run', async () => {
    const s = await setup({
      runner_a: {
        slots: 2,
        answer: async (lease, accept) => {
          await refusedFor(s, 'runner_a', lease);
          // Claims as the scheduler settles the refusal (below), or, should it not, once it moved on.
          await s.journal.next((e) => (e.kind === 'withdrawing' && e.lease === lease) || isOffer('runner_b')(e));
          await accept();
        },
      },
      runner_b: {
        slots: 1,
        answer: async (_lease, accept) => {
          await s.journal.next(isAccept('runner_a'));
          await accept();
        },
      },
    });
    // The withdrawal's script, on its way from the scheduler, is held until the acceptance claimed.
    const evalsha = s.channelRedis.evalsha.bind(s.channelRedis) as (...args: unknown[]) => Promise<unknown>;
    Object.assign(s.channelRedis, {
      evalsha: async (...args: unknown[]) => {
        const withdrawing = args.find((a) => typeof a === 'string' && a.includes(':offer_withdrawn:')) as string | undefined;
        if (withdrawing && args.includes('runner_a')) {
          const lease = withdrawing.slice(withdrawing.indexOf(':offer_withdrawn:') + ':offer_withdrawn:'.length);
          s.journal.push({ kind: 'withdrawing', runner: 'runner_a', lease });
          await s.journal.next(isAccept('runner_a', lease));
        }
        return evalsha(...args);
      },
    });
    await s.start();
    const settled = await s.journal.next(isSettled);
    const accepted = await s.journal.next(isAccept('runner_a'));
    expect(accepted.outcome).toBe('ok');
    expect(settled).toEqual({ kind: 'leased', runner: 'runner_a', lease: accepted.lease });
    expect(s.journal.of('offer').map((e) => e.runner)).toEqual(['runner_a']);
    expect(s.journal.of('leased')).toHaveLength(1);
    expect(await s.fence.current(s.sessionId, s.runId)).toMatchObject({ token: accepted.lease, runner_id: 'runner_a' });
    expect(s.journal.of('error')).toEqual([]);
  }, 20_000);
});
