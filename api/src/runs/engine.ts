import { newId, type Logger } from '@agentplane/core';
import { deliverToRunner } from '@agentplane/gateway';
import { LeaseFence, markPoolActive, type RunQueues } from '@agentplane/lease';
import { frame } from '@agentplane/protocol';
import { tags, type Redis } from '@agentplane/store';
import type { VersionedStore } from '../agents/versioned.js';
import type { Environment } from '../environments/operations.js';
import type { RunnerService } from '../runners/service.js';
import type { RunDoc } from '../sessions/model.js';
import type { SessionStore } from '../sessions/store.js';
import type { TurnScheduler } from '../sessions/turns.js';
import type { RunLifecycle } from './lifecycle.js';
import { requirementsOf } from './spec.js';
import { runSessionsKey } from './operations.js';

export interface RunEngineDeps {
  redis: Redis;
  queues: RunQueues;
  lifecycle: RunLifecycle;
  store: SessionStore;
  environments: VersionedStore<Environment>;
  runners: RunnerService;
  log: Logger;
  /** How long a running Run gets to stop after user.interrupt before it is cancelled outright. */
  interruptGraceMs: number;
}

/**
 * The API's side of scheduling (the `TurnScheduler` the Sessions module calls): a queued Run
 * becomes a BullMQ job in its pool's queue; an interrupt removes a queued Run or cancels the
 * leased one on its runner; answered waits continue the turn in a new Run.
 */
export class RunEngine implements TurnScheduler {
  private readonly fence: LeaseFence;

  constructor(private readonly d: RunEngineDeps) {
    this.fence = new LeaseFence(d.redis);
  }

  async runQueued(run: RunDoc): Promise<void> {
    const env = await this.d.environments.getVersion(run.workspace_id, run.environment_id, run.environment_version);
    const pool = await this.d.runners.defaultPool(run.workspace_id);
    await this.d.queues.enqueue({
      run_id: run.id,
      session_id: run.session_id,
      thread_id: run.session_thread_id,
      workspace_id: run.workspace_id,
      pool_id: pool.id,
      requirements: requirementsOf(env),
      accepted_at_ms: Date.parse(run.created_at),
    });
    await this.d.redis.hset(runSessionsKey(run.workspace_id), run.id, run.session_id);
    await markPoolActive(this.d.redis, pool.id, run.workspace_id);
    await this.d.lifecycle.enqueued(run.session_id, run.id, pool.id);
  }

  async interruptRequested(sessionId: string, _threadId: string, runId: string): Promise<void> {
    const run = await this.d.store.run(sessionId, runId);
    if (!run) return;
    if (run.status === 'queued' || run.status === 'waiting') {
      const pool = run.runner_pool_id;
      if (pool && (await this.d.queues.cancelQueued(pool, runId))) {
        await this.d.lifecycle.canceled(sessionId, runId, 'interrupted while queued');
        return;
      }
    }
    const lease = await this.fence.current(sessionId);
    if (lease.run_id === runId && lease.token && lease.runner_id) {
      const payload = { lease_id: lease.token, attempt: Number(lease.attempt ?? 1), reason: 'user.interrupt', grace_ms: this.d.interruptGraceMs };
      await deliverToRunner(this.d.redis, run.workspace_id, lease.runner_id, frame('lease.cancel', newId('event'), payload));
    }
  }

  async waitsResolved(sessionId: string, threadId: string, runId: string | null): Promise<void> {
    const session = await this.d.store.get((await this.d.store.thread(sessionId, threadId)).workspace_id, sessionId);
    const nextRunId = newId('run');
    let continued = false;
    await this.d.store.updateThread(sessionId, threadId, (t) => {
      continued = false;
      if (t.status !== 'idle' || t._active_run_id !== runId) return null;
      continued = true;
      return { ...t, status: 'running', _active_run_id: nextRunId, _running_since_ms: Date.now(), _stop_reason: null };
    });
    if (!continued) return;
    const run = await this.d.store.createRun(session, threadId, nextRunId, []);
    const withLink = await this.d.store.docs.update<RunDoc>(tags.session(sessionId), run.id, (r) => ({ ...r, continues_run_id: runId }));
    await this.d.store.log.append(sessionId, [{ type: 'session.status_running', payload: { run_id: run.id }, session_thread_id: threadId, producer_key: `status:${run.id}:running` }]);
    await this.runQueued(withLink);
  }
}
