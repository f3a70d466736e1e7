import { describe, expect, it } from 'vitest';
import { context, createLogger, createMetrics } from '@agentplane/core';
import type { RunLifecycle, SessionStore, TurnResult } from '@agentplane/domain';
import type { FrameHandler, Gateway, RunnerConnection } from '@agentplane/gateway';
import { DEFAULT_LEASE_CONFIG, type LeaseKeeper, type LeaseRecord, type LeaseRecords } from '@agentplane/lease';
import type { GatewayToRunnerType, Payload, RunnerToGatewayType } from '@agentplane/protocol';
import type { AppendResult, EventLog } from '@agentplane/store';
import type { ApprovalService } from '../approvals/service.js';
import type { ModelsModule } from '../models/module.js';
import { registerRunHandlers } from './gateway-handlers.js';

const REC: LeaseRecord = {
  lease_id: 'lease-1', run_id: 'run_1', session_id: 'sess_1', thread_id: 'sthr_1', workspace_id: 'wrkspc_1', pool_id: 'rpool_1', attempt: 1, runner_id: 'runner_1', reply_to: 'reply',
};

interface Sent { type: string; payload: unknown; re: string | undefined }

/** An append's answer, as much of it as the handlers read. */
const appended = (seq: number): AppendResult => ({ ok: true, events: [{ seq }] }) as unknown as AppendResult;

/**
 * The run handlers over stand-ins: a gateway that only collects them, a connection that records
 * what is sent, and the lease, Run and approval services as plain functions of the test.
 */
function harness(over: { keeper?: Partial<LeaseKeeper>; lifecycle?: Partial<RunLifecycle>; log?: Partial<EventLog>; store?: Partial<SessionStore>; models?: Partial<ModelsModule> } = {}) {
  const handlers = new Map<string, FrameHandler>();
  /** Answers to the offering scheduler, and the lease records removed (how, and whose). */
  const replies: { channel: string; answer: unknown }[] = [];
  const removed: { how: 'remove' | 'removeOffer'; lease: string; runner: string }[] = [];
  /** What the handlers are told of a connection the gateway forgets. */
  const disconnected: ((conn: RunnerConnection) => void)[] = [];
  /** The socket's state as `send` answers it. */
  const socket = { open: true };
  const gw = {
    on: (type: RunnerToGatewayType, handler: FrameHandler) => void handlers.set(type, handler),
    onConnected: () => undefined,
    onResume: () => undefined,
    onDisconnected: (listener: (conn: RunnerConnection) => void) => void disconnected.push(listener),
    sendToChannel: async (channel: string, message: string) => void replies.push({ channel, answer: JSON.parse(message) }),
  } as unknown as Gateway;
  const sent: Sent[] = [];
  const conn = {
    id: 'conn_1', identity: { runnerId: REC.runner_id, workspaceId: REC.workspace_id }, generation: 1, protocolVersion: 1, status: 'ready',
    send: <T extends GatewayToRunnerType>(type: T, payload: Payload<T>, re?: string) => {
      sent.push({ type, payload, re });
      return socket.open;
    },
    cancelLease: () => undefined,
    close: () => undefined,
  } as unknown as RunnerConnection;
  const records = {
    get: async () => REC, touch: async () => undefined, orphansOf: async () => [],
    remove: async (lease: string, runner: string) => void removed.push({ how: 'remove', lease, runner }),
    removeOffer: async (lease: string, runner: string) => void removed.push({ how: 'removeOffer', lease, runner }),
  } as unknown as LeaseRecords;
  // A use under an ActionApproval waits for the approval.
  const approvals = {
    waitKinds: async (_ws: string, _s: string, _r: string, waits: TurnResult['waits']) => (waits ?? []).map((w) => ({ ...w, kind: 'approval' as const })),
    settleWaits: async () => undefined,
  } as unknown as ApprovalService;
  registerRunHandlers(gw, {
    keeper: over.keeper as LeaseKeeper, records, lifecycle: over.lifecycle as RunLifecycle, log: over.log as EventLog, store: (over.store ?? {}) as SessionStore,
    models: (over.models ?? {}) as ModelsModule, lease: DEFAULT_LEASE_CONFIG, logger: createLogger({ name: 'test', level: 'silent' }), approvals, metrics: createMetrics(),
    interruptGraceMs: 1000,
  });
  const frame = (type: RunnerToGatewayType, id: string, payload: Record<string, unknown>) =>
    (handlers.get(type) as FrameHandler)(conn, { v: 1, type, id, payload } as never, context.active());
  /** The socket is lost: the gateway forgets the connection. */
  const disconnect = () => {
    socket.open = false;
    for (const listener of disconnected) listener(conn);
  };
  return { sent, frame, replies, removed, disconnect };
}

describe('the run handlers', () => {
  it('lease.complete: the job is completed with the end the Run records (waits as the approvals map them, the grader\'s report bounded), and the frame is acknowledged', async () => {
    const completed: unknown[] = [];
    const ended: TurnResult[] = [];
    const h = harness({
      keeper: {
        complete: async (_lease, result) => {
          completed.push(result);
          return 'ok';
        },
        finished: async () => undefined,
      },
      lifecycle: { succeeded: async (_s, _r, _l, result) => void ended.push(result) },
    });
    const grader = { input: { system: 'grade', messages: [] }, output: 'ok', usage: { input_tokens: 2, note: 'dropped' } };
    await h.frame('lease.complete', 'c1', {
      lease_id: REC.lease_id, attempt: 1, result: { stop_reason: { type: 'requires_action' }, waits: [{ tool_use_id: 'toolu_1', kind: 'custom_tool' }], grader, usage: { input_tokens: 9 } },
    });
    const end = { stop_reason: { type: 'requires_action' }, waits: [{ tool_use_id: 'toolu_1', kind: 'approval' }], grader: { ...grader, usage: { input_tokens: 2 } } };
    // The job carries what a replay of it (the scheduler's reconciliation) must record.
    expect(completed).toEqual([end]);
    expect(ended).toEqual([end]);
    expect(h.sent).toEqual([{ type: 'ack', payload: {}, re: 'c1' }]);
  });

  it('lease.accept refused (its offer was withdrawn: the scheduler moved on): only this runner\'s offer record goes, the answer names the runner, the lease is revoked', async () => {
    const h = harness({ keeper: { accept: async () => 'taken' } });
    await h.frame('lease.accept', 'a1', { lease_id: REC.lease_id, attempt: 1 });
    // The next runner offered the same lease id has a record of its own under it: it stays.
    expect(h.removed).toEqual([{ how: 'removeOffer', lease: REC.lease_id, runner: REC.runner_id }]);
    // An answer about this runner: the scheduler, waiting for the next runner now, ignores it.
    expect(h.replies).toEqual([{ channel: REC.reply_to, answer: { lease_id: REC.lease_id, runner_id: REC.runner_id, outcome: 'rejected', reason: 'taken' } }]);
    expect(h.sent).toEqual([{ type: 'lease.revoked', payload: { lease_id: REC.lease_id, attempt: 1, reason: 'the offer was withdrawn or the lease belongs to another runner' }, re: undefined }]);
  });

  it('lease.accept taken: the answer names the runner and says the Run records the lease', async () => {
    const h = harness({ keeper: { accept: async () => 'ok' } });
    await h.frame('lease.accept', 'a1', { lease_id: REC.lease_id, attempt: 1 });
    expect(h.replies).toEqual([{ channel: REC.reply_to, answer: { lease_id: REC.lease_id, runner_id: REC.runner_id, outcome: 'accepted', recorded: true } }]);
    expect(h.removed).toEqual([]);
    expect(h.sent).toEqual([]);
  });

  it('a revoked lease leaves nothing behind: a later batch of it takes the first batch\'s path again', async () => {
    const first: string[] = [];
    const h = harness({
      keeper: { heartbeat: async () => 'lost' },
      lifecycle: {
        appendFirstEvents: async (_s, runId) => {
          first.push(runId);
          return appended(1);
        },
      },
      log: { append: async () => appended(2) },
    });
    const batch = (id: string) => h.frame('events.batch', id, {
      lease_id: REC.lease_id, attempt: 1, session_id: REC.session_id, events: [{ producer_key: id, type: 'agent.message', payload: {} }],
    });
    await batch('b1');
    await batch('b2');
    expect(first).toHaveLength(1);
    await h.frame('lease.heartbeat', 'h1', { lease_id: REC.lease_id, attempt: 1 });
    expect(h.sent.some((s) => s.type === 'lease.revoked')).toBe(true);
    await batch('b3');
    expect(first).toHaveLength(2);
  });

  it('a model request whose lease check was under way when its socket was lost starts no provider request', async () => {
    let checked!: () => void;
    const checking = new Promise<void>((r) => (checked = r));
    const signals: AbortSignal[] = [];
    const h = harness({
      keeper: {
        holds: async () => {
          await checking;
          return true;
        },
      },
      store: { get: async () => { throw new Error('not read'); } },
      models: {
        gateway: {
          // A provider that sends nothing until its request is aborted (a long think).
          async *runModelStep(_ws: string, _request: unknown, signal: AbortSignal) {
            signals.push(signal);
            if (!signal.aborted) await new Promise<void>((r) => signal.addEventListener('abort', () => r(), { once: true }));
            yield { type: 'end', stop_reason: 'canceled' };
          },
        } as unknown as ModelsModule['gateway'],
      },
    });
    const served = h.frame('model.request', 'm1', { lease_id: REC.lease_id, attempt: 1, stream_id: 'stream-1', request: {} });
    await new Promise((r) => setTimeout(r, 10));
    h.disconnect();
    checked();
    // Nothing could abort a provider request started now before its first event: none is started.
    await Promise.race([served, new Promise((r) => setTimeout(r, 200))]);
    expect(signals.every((s) => s.aborted)).toBe(true);
  });

  it('a model request whose Session cannot be read (its budget unknown) is not served: a retryable error, no provider request', async () => {
    let started = 0;
    const h = harness({
      keeper: { holds: async () => true },
      store: { get: async () => { throw new Error('redis went away'); } },
      models: {
        gateway: {
          async *runModelStep() {
            started++;
            yield { type: 'end', stop_reason: 'end_turn' };
          },
        } as unknown as ModelsModule['gateway'],
      },
    });
    await h.frame('model.request', 'm1', { lease_id: REC.lease_id, attempt: 1, stream_id: 'stream-1', request: {} });
    expect(started).toBe(0);
    expect(h.sent).toEqual([{ type: 'model.end', payload: { stream_id: 'stream-1', event: { type: 'error', error: expect.objectContaining({ type: 'runtime.internal', retryable: true }) } }, re: undefined }]);
  });
});

