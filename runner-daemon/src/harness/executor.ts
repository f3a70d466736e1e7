/**
 * Lease → Run glue: turns an accepted lease into one harness Run in the Session's sandbox.
 * Events go out through the lease's event batches with producer keys derived from the lease
 * attempt (a resent batch is appended once). The model client and the spec come from the
 * integration; this module only fixes the shape it expects in `lease.offer.spec`.
 */
import type { ModelClient, ModelMessage, TokenUsage } from '@agentplane/protocol';
import type { Logger } from '@agentplane/core';
import type { SandboxManager } from '../sandbox/manager.js';
import type { ResolvedResource } from '../sandbox/resources.js';
import type { EnvironmentRequirements, SandboxEnvironment } from '../sandbox/types.js';
import type { AgentConfig, HarnessEvent, IdleStopReason, SessionEventSink, StepRecord } from './events.js';
import { HarnessLoop, type PendingResponses } from './loop.js';

/** What the executor needs of a lease (structurally the runner's `LeaseHandle`). */
export interface HarnessLease {
  readonly lease: { lease_id: string; attempt: number };
  readonly offer: { run_id: string; session_id: string; thread_id?: string; spec: Record<string, unknown> };
  readonly signal: AbortSignal;
  sendEvents(sessionId: string, events: Array<{ producer_key: string; type: string; payload: unknown }>): void;
}

/** The expected `lease.offer.spec` of a harness Run. */
export interface HarnessRunSpec {
  agent: AgentConfig;
  environment: SandboxEnvironment & { requirements?: EnvironmentRequirements };
  history: ModelMessage[];
  responses?: PendingResponses;
  /** Resources already resolved to bytes (base64 in JSON) for the first Run. */
  resources?: Array<
    | { type: 'file'; id: string; mount_path: string; content_base64: string }
    | { type: 'repository'; id: string; mount_path: string; tar_base64: string }
  >;
}

export class HarnessSpecError extends Error {
  constructor(message: string) {
    super(message);
    this.name = 'HarnessSpecError';
  }
}

export function parseHarnessSpec(spec: Record<string, unknown>): HarnessRunSpec {
  const agent = spec.agent as Partial<AgentConfig> | undefined;
  if (!agent || typeof agent.routing_key !== 'string' || !Array.isArray(agent.tools)) {
    throw new HarnessSpecError('spec.agent needs routing_key and tools');
  }
  if (!Array.isArray(spec.history)) throw new HarnessSpecError('spec.history must be an array of messages');
  const environment = (spec.environment ?? {}) as HarnessRunSpec['environment'];
  if (typeof environment !== 'object') throw new HarnessSpecError('spec.environment must be an object');
  return {
    agent: agent as AgentConfig,
    environment,
    history: spec.history as ModelMessage[],
    ...(spec.responses ? { responses: spec.responses as PendingResponses } : {}),
    ...(Array.isArray(spec.resources) ? { resources: spec.resources as HarnessRunSpec['resources'] } : {}),
  };
}

function resolveResources(spec: HarnessRunSpec): ResolvedResource[] {
  return (spec.resources ?? []).map((r) =>
    r.type === 'file'
      ? { type: 'file', id: r.id, mount_path: r.mount_path, content: Buffer.from(r.content_base64, 'base64') }
      : { type: 'repository', id: r.id, mount_path: r.mount_path, snapshot: { kind: 'tar', data: Buffer.from(r.tar_base64, 'base64') } },
  );
}

/** Sends each event in its own batch entry with a producer key unique to the lease attempt. */
export class LeaseEventSink implements SessionEventSink {
  private seq = 0;
  readonly steps: StepRecord[] = [];

  constructor(
    private readonly handle: HarnessLease,
    private readonly onStep?: (record: StepRecord) => void,
  ) {}

  async emit(event: HarnessEvent & { session_thread_id?: string }): Promise<void> {
    const { lease } = this.handle;
    const payload = event.session_thread_id ? { ...event.payload, session_thread_id: event.session_thread_id } : event.payload;
    this.handle.sendEvents(this.handle.offer.session_id, [
      { producer_key: `${lease.lease_id}:${lease.attempt}:${this.seq++}`, type: event.type, payload },
    ]);
  }

  step(record: StepRecord): void {
    this.steps.push(record);
    this.onStep?.(record);
  }
}

export interface HarnessExecutorDeps {
  sandboxes: SandboxManager;
  /** The model gateway client bound to this lease (model.request frames carry the lease). */
  modelFor(handle: HarnessLease): ModelClient;
  logger?: Logger;
}

export interface HarnessRunResult extends Record<string, unknown> {
  stop_reason: IdleStopReason;
  usage: TokenUsage;
  steps: StepRecord[];
  history: ModelMessage[];
}

/** A lease executor: resolve = lease.complete with the Run's result; reject = lease.fail. */
export function createHarnessExecutor(deps: HarnessExecutorDeps): (handle: HarnessLease) => Promise<HarnessRunResult> {
  return async (handle) => {
    const spec = parseHarnessSpec(handle.offer.spec);
    const session = { id: handle.offer.session_id };
    const { sandbox } = await deps.sandboxes.prepare(session, spec.environment, resolveResources(spec), handle.signal);
    try {
      const sink = new LeaseEventSink(handle);
      const loop = new HarnessLoop({ model: deps.modelFor(handle), driver: deps.sandboxes.driver, sandbox, sink, ...(deps.logger ? { logger: deps.logger } : {}) });
      const outcome = await loop.run({
        agent: spec.agent,
        history: spec.history,
        ...(spec.responses ? { responses: spec.responses } : {}),
        ...(handle.offer.thread_id ? { session_thread_id: handle.offer.thread_id } : {}),
        signal: handle.signal,
        ...(spec.environment.max_duration_seconds ? { max_duration_seconds: spec.environment.max_duration_seconds } : {}),
      });
      return { stop_reason: outcome.stop_reason, usage: outcome.usage, steps: outcome.steps, history: outcome.history };
    } finally {
      deps.sandboxes.runEnded(session.id);
    }
  };
}
