import { createHash } from 'node:crypto';
import type { Logger } from '@agentplane/core';
import type { Payload } from '@agentplane/protocol';
import type { LeaseExecutor, LeaseHandle } from './agent.js';
import { HarnessError, HarnessLoop, type AgentTool, type HarnessEvent, type SessionEventSink } from './harness/index.js';
import { connectMcpTools, type RuntimeMcp } from './harness/mcp-tools.js';
import { driverSatisfies, type SandboxDriver, type SandboxEnvironment } from './sandbox/types.js';

/** The turn spec carried by a lease offer (built by the scheduler; see docs/RUNS.md). */
interface TurnSpec {
  run_id: string;
  session_id: string;
  thread_id: string;
  agent: { routing_key: string; system?: string; tools: AgentTool[] };
  environment: {
    image: string;
    resources: { cpu_millis: number; memory_mib: number; disk_mib: number; max_duration_seconds: number };
    network_mode: string;
    retention_mode: string;
    tier?: string;
  };
  history: Parameters<HarnessLoop['run']>[0]['history'];
  responses: Parameters<HarnessLoop['run']>[0]['responses'];
  runtime_mcp?: RuntimeMcp;
}

function asSpec(spec: Record<string, unknown>): TurnSpec {
  const s = spec as Partial<TurnSpec>;
  if (!s.run_id || !s.session_id || !s.thread_id || !s.agent || !s.environment || !Array.isArray(s.history)) {
    throw new Error('the lease offer carries no usable turn spec');
  }
  return s as TurnSpec;
}

const TOOL_USE_ID = /^toolu_[0-9A-Za-z]{1,64}$/;

/**
 * A sink that turns harness events into idempotent event batches on the lease: producer keys
 * are `<lease>:<n>`, so a batch resent after a reconnect is appended once. Tool-use ids that
 * are not already `toolu_…` (OpenAI-style ids) are mapped deterministically, so drive events can
 * answer them. `session.status_idle` is not forwarded: the control plane ends the turn from
 * lease.complete, once.
 */
class LeaseSink implements SessionEventSink {
  private n = 0;
  readonly awaiting = new Map<string, 'custom_tool_result' | 'tool_confirmation'>();
  private readonly ids = new Map<string, string>();
  private chain: Promise<unknown> = Promise.resolve();

  constructor(private readonly handle: LeaseHandle, private readonly spec: TurnSpec) {}

  toolId(id: string): string {
    if (TOOL_USE_ID.test(id)) return id;
    let mapped = this.ids.get(id);
    if (!mapped) {
      mapped = `toolu_${createHash('sha256').update(`${this.spec.run_id}\0${id}`).digest('hex').slice(0, 32)}`;
      this.ids.set(id, mapped);
    }
    return mapped;
  }

  async emit(event: HarnessEvent & { session_thread_id?: string }): Promise<void> {
    if (event.type === 'session.status_idle') return;
    let payload: unknown = event.payload;
    if (event.type === 'agent.tool_use') {
      const id = this.toolId(event.payload.id);
      payload = { ...event.payload, id };
      if (event.payload.blocking && event.payload.awaiting) this.awaiting.set(id, event.payload.awaiting);
    } else if (event.type === 'agent.tool_result') {
      payload = { ...event.payload, tool_use_id: this.toolId(event.payload.tool_use_id) };
    }
    const batch: Payload<'events.batch'>['events'] = [{ producer_key: `${this.handle.lease.lease_id}:${this.n++}`, type: event.type, payload }];
    // Events go out in order, each acknowledged before the next.
    const next = this.chain.then(() => this.handle.deliverEvents(this.spec.session_id, batch));
    this.chain = next.catch(() => undefined);
    await next;
  }
}

export interface TurnExecutorOptions {
  driver: SandboxDriver;
  log: Logger;
  /** The control plane (for the runtime MCP endpoint). */
  baseUrl: string;
}

/** Runs one turn per lease: sandbox for the Session, the harness loop, events back on the lease. */
export function turnExecutor(o: TurnExecutorOptions): LeaseExecutor {
  return {
    refuse(offer) {
      try {
        const spec = asSpec(offer.spec);
        const tier = spec.environment.tier === 'process' ? 'process' : 'container';
        if (!driverSatisfies(o.driver, { tier, network_mode: 'none' })) return `the ${o.driver.name} driver does not offer tier '${tier}'`;
        return null;
      } catch (err) {
        return err instanceof Error ? err.message : 'not a turn spec';
      }
    },
    run: (handle) => runTurn(o, handle),
  };
}

/** The first executor that takes the offer runs it (e.g. the turn executor, then the noop driver). */
export function firstWilling(...executors: LeaseExecutor[]): LeaseExecutor {
  const pick = (offer: LeaseHandle['offer']) => executors.find((e) => e.refuse(offer) === null);
  return {
    refuse: (offer) => (pick(offer) ? null : (executors[0]?.refuse(offer) ?? 'no executor is installed')),
    run: (handle) => {
      const e = pick(handle.offer);
      if (!e) return Promise.reject(new Error('no executor takes this offer'));
      return e.run(handle);
    },
  };
}

async function runTurn(o: TurnExecutorOptions, handle: LeaseHandle): Promise<Record<string, unknown>> {
  {
    const spec = asSpec(handle.offer.spec);
    const log = o.log.child({ run: spec.run_id, lease: handle.lease.lease_id });
    const env: SandboxEnvironment = {
      image: spec.environment.image,
      tier: spec.environment.tier === 'process' ? 'process' : 'container',
      network_mode: 'none',
      cpu_millis: spec.environment.resources.cpu_millis,
      memory_mib: spec.environment.resources.memory_mib,
      max_duration_seconds: spec.environment.resources.max_duration_seconds,
    };
    if (!driverSatisfies(o.driver, { tier: env.tier ?? 'container', network_mode: 'none' })) {
      throw new Error(`the ${o.driver.name} driver cannot give this Environment the isolation it requires (tier ${env.tier ?? 'container'})`);
    }
    const sandbox = await o.driver.ensure({ id: spec.session_id }, env);
    const sink = new LeaseSink(handle, spec);
    const mcp = spec.runtime_mcp ? await connectMcpTools(o.baseUrl, spec.runtime_mcp, log, handle.signal) : undefined;
    const loop = new HarnessLoop({ model: handle.model, driver: o.driver, sandbox, sink, logger: log });
    let outcome;
    try {
      outcome = await loop.run({
      agent: { routing_key: spec.agent.routing_key, ...(spec.agent.system ? { system: spec.agent.system } : {}), tools: [...spec.agent.tools, ...(mcp?.tools ?? [])] },
      history: spec.history,
      ...(spec.responses ? { responses: spec.responses } : {}),
      session_thread_id: spec.thread_id,
      signal: handle.signal,
      max_duration_seconds: spec.environment.resources.max_duration_seconds,
      });
    } catch (err) {
      await mcp?.close();
      // A spent budget ends the turn with its own stop reason instead of failing the Run.
      if (err instanceof HarnessError && err.modelError?.type === 'budget.exceeded') {
        return { stop_reason: { type: 'budget_exceeded', message: err.modelError.message } };
      }
      throw err;
    }
    await mcp?.close();
    const stop = outcome.stop_reason;
    if (stop.type === 'requires_action') {
      const ids = stop.tool_use_ids.map((id) => sink.toolId(id));
      return {
        stop_reason: { type: 'requires_action', tool_use_ids: ids },
        waits: ids.map((id) => ({ tool_use_id: id, kind: sink.awaiting.get(id) === 'tool_confirmation' ? 'confirmation' : 'custom_tool' })),
        usage: outcome.usage,
      };
    }
    return { stop_reason: stop, usage: outcome.usage };
  }
}
