import { randomUUID } from 'node:crypto';
import { ATTR, inSpan, tracingEnabled, type Logger } from '@agentplane/core';
import type { LeaseExecutor, LeaseHandle } from '../agent.js';
import type { TokenUsage } from '@agentplane/protocol';
import { HarnessError, HarnessLoop, type AgentTool, type Awaiting, type IdleStopReason } from '../harness/index.js';
import type { ToolTracer } from '../harness/loop.js';
import { connectMcpTools, type RuntimeMcp } from '../harness/mcp-tools.js';
import type { SandboxManager } from '../sandbox/manager.js';
import { isOfferedResource, isOfferedSkill, offeredSources, skillSources, type OfferedResource, type OfferedSkill } from '../sandbox/sources.js';
import { SKILL_TOOL_NAME, skillsPrompt } from '../harness/tools/builtin.js';
import { driverSatisfies, SandboxError, type SandboxDriver, type SandboxEnvironment, type SandboxErrorReason, type SandboxTier, type NetworkMode } from '../sandbox/types.js';
import { colocatedHarnessAvailable, runColocated } from './colocated.js';
import { LeaseSink } from './lease-sink.js';
import { isGraderTurn, runGrader } from './grader.js';
import type { RunnerMetrics } from '../metrics.js';
import { InfrastructureFailure } from '../failures.js';
import { runAcp } from '../acp/client.js';
import { harnessArgv, type AcpHarnesses } from '../acp/install.js';
import { BrowserSession } from '../harness/tools/browser-session.js';
import type { FileStore } from '../harness/tools/types.js';
import { launchInSandbox } from '../sandbox/browser.js';
import { apiUrl } from '@agentplane/core';

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
    /** With `network_mode` `allowlist`: the hosts the sandbox's egress proxy connects to. */
    allowed_hosts?: string[];
    retention_mode: string;
    tier?: string;
    /** Where the agent loop runs: in the runner (`split`, the default) or inside the sandbox. */
    harness_topology?: 'split' | 'colocated';
    /** A third-party ACP agent instead of the built-in loop (docs/ACP.md). */
    harness?: { kind: 'acp'; package: string; command: string; args?: string[] };
    /** The Environment's opt-in browser. */
    browser?: boolean;
  };
  /** Session resources to materialise in the workspace (see the API's `SpecResource`). */
  resources?: unknown[];
  history: Parameters<HarnessLoop['run']>[0]['history'];
  responses: Parameters<HarnessLoop['run']>[0]['responses'];
  runtime_mcp?: RuntimeMcp;
  runtime_files?: { bearer: string };
  /** Skills placed read-only in the workspace and named to the model (see the API's `SpecSkill`). */
  skills?: unknown[];
  /** `outcome_grader`: one grader model step instead of an agent turn (./grader.ts). */
  kind?: 'turn' | 'outcome_grader';
  grader?: unknown;
  /** The sandbox the turn runs in: a child thread of a coordinator Session has its own (docs/COORDINATION.md). */
  sandbox_id?: string;
}

function asSpec(spec: Record<string, unknown>): TurnSpec {
  const s = spec as Partial<TurnSpec>;
  if (!s.run_id || !s.session_id || !s.thread_id || !s.agent || !s.environment || !Array.isArray(s.history)) {
    throw new Error('the lease offer carries no usable turn spec');
  }
  if (s.resources !== undefined && (!Array.isArray(s.resources) || !s.resources.every(isOfferedResource))) {
    throw new Error('the lease offer carries malformed resources');
  }
  if (s.skills !== undefined && (!Array.isArray(s.skills) || !s.skills.every(isOfferedSkill))) throw new Error('the lease offer carries malformed skills');
  if (s.sandbox_id !== undefined && (typeof s.sandbox_id !== 'string' || !/^[A-Za-z0-9_.-]{1,64}$/.test(s.sandbox_id))) throw new Error('the lease offer carries a malformed sandbox id');
  if (s.kind !== undefined && s.kind !== 'turn' && s.kind !== 'outcome_grader') throw new Error(`unknown run kind '${String(s.kind)}'`);
  if (s.kind === 'outcome_grader' && !isGraderTurn(s.grader)) throw new Error('the lease offer carries a malformed grader spec');
  return s as TurnSpec;
}

/** Whether the driver verified browser observation (its canary ran). */
function browserOffered(driver: SandboxDriver): boolean {
  const v = (driver as { verifiedBrowser?: () => { accessibility_tree: boolean; screenshot: boolean } }).verifiedBrowser?.();
  return v !== undefined && v.accessibility_tree && v.screenshot;
}

/** How often a store the control plane did not answer is sent again, and the wait before each. */
const STORE_RETRY_DELAYS_MS = [250, 1_000, 3_000];

/**
 * Stores a File of the Session through the control plane's runtime file route (the lease's
 * runtime bearer carries the `outputs` grant on browser Runs). Sent under an Idempotency-Key of
 * its own, and sent again under it when the control plane did not answer or answered 5xx (an api
 * restarting): stored once, however many times it is sent.
 */
export function runtimeFileStore(baseUrl: string, bearer: string | undefined, signal?: AbortSignal, retryDelaysMs: readonly number[] = STORE_RETRY_DELAYS_MS): FileStore {
  return async (file) => {
    if (!bearer) throw new Error('this Run has no runtime bearer to store Files with');
    const key = `runtime-output-${randomUUID()}`;
    const send = () => fetch(apiUrl(baseUrl, `/v1/runtime/files?filename=${encodeURIComponent(file.filename)}`), {
      method: 'POST', headers: { authorization: `Bearer ${bearer}`, 'content-type': file.content_type, 'idempotency-key': key }, body: new Uint8Array(file.data), signal: signal ?? null,
    });
    let res: Response | undefined;
    for (let attempt = 0; ; attempt++) {
      const failure = await send().then((r) => {
        res = r;
        return r.status >= 500 ? new Error(`HTTP ${r.status}`) : null;
      }, (err: unknown) => err);
      const delay = retryDelaysMs[attempt];
      if (failure === null || delay === undefined || signal?.aborted) break;
      await res?.body?.cancel().catch(() => undefined);
      res = undefined;
      await new Promise((r) => setTimeout(r, delay));
    }
    if (!res) throw new Error('the control plane did not answer the File store');
    if (res.status !== 201) throw new Error(`the control plane did not store the File (HTTP ${res.status}: ${(await res.text()).slice(0, 200)})`);
    const body = (await res.json()) as { id?: unknown };
    if (typeof body.id !== 'string') throw new Error('the control plane answered without a File id');
    return { file_id: body.id };
  };
}

/** What the control plane calls each kind of wait (the thread's `_waits`). */
const waitKind = (a: string | undefined): 'confirmation' | 'question' | 'custom_tool' =>
  a === 'tool_confirmation' ? 'confirmation' : a === 'question_answer' ? 'question' : 'custom_tool';

/** Why a sandbox could not be had that lie with the engine, not with the Run: not answering, too slow, refusing the container. */
const ENGINE_FAILURES: ReadonlySet<SandboxErrorReason> = new Set(['docker_unavailable', 'start_timeout', 'start_failed']);

/**
 * A sandbox the engine did not start is the machine's failure, not the agent's work: the lease
 * fails as `infrastructure` and the Run is retried (docs/RUNS.md), instead of ending the turn.
 */
function engineFailure(err: unknown): unknown {
  return err instanceof SandboxError && ENGINE_FAILURES.has(err.reason) ? new InfrastructureFailure(err.message, { cause: err }) : err;
}

/** The sandbox network a turn asks for: `none`, or `allowlist` with hosts; undefined for a mode this runner does not know. */
const networkOf = (spec: TurnSpec): 'none' | 'allowlist' | undefined => {
  const mode = spec.environment.network_mode;
  if (mode === 'allowlist') return Array.isArray(spec.environment.allowed_hosts) && spec.environment.allowed_hosts.length > 0 ? 'allowlist' : undefined;
  return mode === 'none' || mode === undefined ? 'none' : undefined;
};
const tierOf = (spec: TurnSpec): SandboxTier => (spec.environment.tier === 'process' || spec.environment.tier === 'gvisor' ? spec.environment.tier : 'container');

export interface TurnExecutorOptions {
  sandboxes: SandboxManager;
  log: Logger;
  /** The control plane (runtime MCP endpoint, runtime file route). */
  baseUrl: string;
  repositoryMaxBytes?: number;
  metrics?: RunnerMetrics;
  /** The ACP agent harnesses this runner installed and verified. */
  acp?: AcpHarnesses;
  /** ACP session ids of earlier Runs, by Session (kept while the runner lives). */
  acpSessions?: Map<string, string>;
}

/**
 * Runs one turn per lease: the Session's sandbox (created or reused, resources materialised
 * before the first Run), the harness loop, events back on the lease. Keeps the sandboxes
 * between Runs and gives them up when told (Session ended, lease lost).
 */
export function turnExecutor(o: TurnExecutorOptions): LeaseExecutor {
  const driver = o.sandboxes.driver;
  /** The sandbox each running lease's work uses (`<lease id>#<attempt>` → sandbox id). */
  const sandboxOfLease = new Map<string, string>();
  return {
    refuse(offer) {
      try {
        const spec = asSpec(offer.spec);
        const tier = tierOf(spec);
        const network = networkOf(spec);
        if (!network) return `unknown network mode '${String(spec.environment.network_mode)}'`;
        if (!driverSatisfies(driver, { tier, network_mode: 'none' })) return `the ${driver.name} driver does not offer tier '${tier}'`;
        if (!driverSatisfies(driver, { tier, network_mode: network })) return `the ${driver.name} driver does not offer network mode '${network}'`;
        const topology = spec.environment.harness_topology ?? 'split';
        if (topology !== 'split' && topology !== 'colocated') return `unknown harness topology '${String(topology)}'`;
        if (topology === 'colocated' && !colocatedHarnessAvailable()) return 'this runner build has no colocated harness bundle';
        const acp = spec.environment.harness;
        if (acp !== undefined) {
          if (acp.kind !== 'acp') return `unknown harness kind '${String(acp.kind)}'`;
          const h = o.acp?.find(acp.package);
          if (!h) return `the ACP harness ${acp.package} is not installed on this runner`;
          if (!harnessArgv(h, acp.command, driver.name)) return `the ACP harness ${acp.package} has no command '${acp.command}'`;
        }
        if (spec.environment.browser && !browserOffered(driver)) return 'this runner does not offer browser observation';
        if (spec.environment.browser && tier !== 'container') return `browser observation runs under tier 'container', not '${tier}'`;
        return null;
      } catch (err) {
        return err instanceof Error ? err.message : 'not a turn spec';
      }
    },
    run: async (handle) => {
      const key = `${handle.lease.lease_id}#${handle.lease.attempt}`;
      try {
        return await runTurn(o, handle, (sandboxId) => sandboxOfLease.set(key, sandboxId));
      } finally {
        sandboxOfLease.delete(key);
      }
    },
    sandboxes: () => o.sandboxes.sessions(),
    releaseSandbox: async (sessionId, reason) => {
      o.log.info({ session: sessionId, reason }, 'removing the sandbox of an ended Session');
      await o.sandboxes.sessionEnded(sessionId);
    },
    // The lease's own sandbox: a child thread's is not its Session's, whose primary thread (or
    // another child) may be running here under a lease that is not lost. A lease whose work never
    // reached its sandbox has nothing to stop.
    leaseLost: async (sessionId, lease) => {
      if (!lease) return o.sandboxes.leaseLost(sessionId);
      const sandboxId = sandboxOfLease.get(`${lease.lease_id}#${lease.attempt}`);
      if (sandboxId !== undefined) await o.sandboxes.leaseLost(sandboxId);
    },
  };
}

/**
 * With tracing on, the driver as the harness sees it: each exec is a span (the driver and the
 * exit code; never the command, its input or its output).
 */
function tracedDriver(driver: SandboxDriver): SandboxDriver {
  if (!tracingEnabled()) return driver;
  const exec: SandboxDriver['exec'] = (sandbox, command, options) =>
    inSpan('sandbox exec', { attributes: { 'agentplane.sandbox.driver': driver.name, 'agentplane.session.id': sandbox.sessionId } }, async (span) => {
      const r = await driver.exec(sandbox, command, options);
      span.setAttribute(ATTR.processExitCode, r.exitCode);
      return r;
    });
  return new Proxy(driver, {
    get(target, prop) {
      if (prop === 'exec') return exec;
      const v: unknown = Reflect.get(target, prop, target);
      return typeof v === 'function' ? (v as (...a: unknown[]) => unknown).bind(target) : v;
    },
  });
}

/**
 * The tools a turn offers the model: the Agent's, the built-in `skill` when the Run places skills
 * (unless the Agent names it already), then the Run's MCP tools; never two under one name, which
 * providers refuse (every model step of the turn would fail) and of which the harness could not
 * tell which one a use means. Of tools sharing a name, the built-in `skill` wins: the skills
 * prompt tells the model to open skills with it, and an Agent stored before custom tools named
 * `skill` were refused may still hold one. Otherwise the first one wins, the one the harness
 * runs a use of that name with (the Agent's own tools before the MCP tools). Each tool left out
 * is logged.
 */
export function offeredTools(agentTools: readonly AgentTool[], withSkills: boolean, mcpTools: readonly AgentTool[], log: Pick<Logger, 'warn'>): AgentTool[] {
  const hasSkillTool = agentTools.some((t) => t.type === 'builtin' && t.name === SKILL_TOOL_NAME);
  const skillTool: AgentTool[] = withSkills && !hasSkillTool ? [{ type: 'builtin', name: SKILL_TOOL_NAME, permission: 'always_allow' }] : [];
  const all = [...agentTools, ...skillTool, ...mcpTools];
  // The name the model sees, as the harness offers it (none: a built-in this runner does not offer).
  const names = all.map((t) => HarnessLoop.toolSpecs({ routing_key: '', tools: [t] })[0]?.name);
  const wins = (t: AgentTool) => t.type === 'builtin' && t.name === SKILL_TOOL_NAME;
  const chosen = new Map<string, number>();
  names.forEach((name, i) => {
    if (name === undefined) return;
    const held = chosen.get(name);
    if (held === undefined || (wins(all[i]!) && !wins(all[held]!))) chosen.set(name, i);
  });
  return all.filter((t, i) => {
    const name = names[i];
    const kept = name === undefined ? i : chosen.get(name);
    if (kept === i || kept === undefined) return true;
    log.warn({ tool: name, left_out: t.type, offered: all[kept]!.type }, 'two tools under one name: one is offered, the other left out of this turn');
    return false;
  });
}

/** Each tool use of the split harness as a GenAI `execute_tool` span (name and call id; never input or result). */
const traceTool: ToolTracer = (tool, run, failed) =>
  inSpan(`execute_tool ${tool.name}`, {
    attributes: { [ATTR.genAiOperationName]: 'execute_tool', 'gen_ai.tool.name': tool.name, 'gen_ai.tool.call.id': tool.id },
  }, async (span) => {
    const result = await run();
    if (failed(result)) span.setAttribute('error.type', 'tool_error');
    return result;
  });

async function runTurn(o: TurnExecutorOptions, handle: LeaseHandle, usesSandbox: (sandboxId: string) => void): Promise<Record<string, unknown>> {
  const spec = asSpec(handle.offer.spec);
  usesSandbox(spec.sandbox_id ?? spec.session_id);
  const log = o.log.child({ run: spec.run_id, lease: handle.lease.lease_id });
  const acpSetting = spec.environment.harness;
  const acpHarness = acpSetting ? o.acp?.find(acpSetting.package) : undefined;
  if (acpSetting && !acpHarness) throw new InfrastructureFailure(`the ACP harness ${acpSetting.package} is not installed on this runner`);
  const network = networkOf(spec) ?? 'none';
  const env: SandboxEnvironment & { requirements: { tier: SandboxTier; network_mode: NetworkMode } } = {
    // An ACP harness runs from its own image layer over the Environment's image.
    image: acpHarness && o.acp ? await o.acp.imageFor(spec.environment.image, acpHarness) : spec.environment.image,
    tier: tierOf(spec),
    network_mode: network,
    ...(network === 'allowlist' ? { allowed_hosts: spec.environment.allowed_hosts ?? [] } : {}),
    cpu_millis: spec.environment.resources.cpu_millis,
    memory_mib: spec.environment.resources.memory_mib,
    disk_mib: spec.environment.resources.disk_mib,
    max_duration_seconds: spec.environment.resources.max_duration_seconds,
    ...(spec.environment.browser ? { browser: true } : {}),
    requirements: { tier: tierOf(spec), network_mode: network },
  };
  const sourceOptions = { baseUrl: o.baseUrl, bearer: spec.runtime_files?.bearer, ...(o.repositoryMaxBytes ? { repositoryMaxBytes: o.repositoryMaxBytes } : {}) };
  const skills = (spec.skills ?? []) as OfferedSkill[];
  const sources = [...offeredSources((spec.resources ?? []) as OfferedResource[], sourceOptions), ...skillSources(skills, sourceOptions)];
  const endStart = o.metrics?.sandboxStartSeconds.startTimer({ driver: o.sandboxes.driver.name === 'docker' ? 'docker' : 'process' });
  const { sandbox, materialized } = await o.sandboxes.prepare({ id: spec.sandbox_id ?? spec.session_id }, env, sources, handle.signal).catch((err: unknown) => {
    throw engineFailure(err);
  });
  endStart?.();
  try {
    if (spec.kind === 'outcome_grader' && isGraderTurn(spec.grader)) return await runGrader({ driver: o.sandboxes.driver, log }, handle, spec.grader, sandbox);
    if (materialized && !materialized.skipped) log.info({ resources: materialized.placed, files: materialized.files, bytes: materialized.bytes }, 'session resources materialised');
    const sink = new LeaseSink(handle, spec.run_id, spec.session_id);
    const mcp = spec.runtime_mcp && !acpSetting ? await connectMcpTools(o.baseUrl, spec.runtime_mcp, log, handle.signal) : undefined;
    // Skills: the system prompt names them (name and description), the `skill` tool opens one.
    const system = skills.length > 0 ? [spec.agent.system, skillsPrompt(skills)].filter(Boolean).join('\n\n') : spec.agent.system;
    const agent = { routing_key: spec.agent.routing_key, ...(system ? { system } : {}), tools: offeredTools(spec.agent.tools, skills.length > 0, mcp?.tools ?? [], log) };
    type Outcome = { stop_reason: IdleStopReason; usage: TokenUsage; awaiting?: Map<string, Awaiting> };
    let outcome: Outcome;
    const driver = tracedDriver(o.sandboxes.driver);
    // The Run's browser: Chromium in the sandbox, started on first use, ended with the Run.
    const browser = spec.environment.browser && spec.environment.harness_topology !== 'colocated'
      ? new BrowserSession(() => launchInSandbox(o.sandboxes.driver, sandbox, { timeoutMs: 30_000 }))
      : undefined;
    const runHarness = (): Promise<Outcome> => {
      if (acpSetting && acpHarness) {
        // A third-party agent inside the sandbox, driven over ACP (../acp/client.ts).
        return runAcp({
          driver, sandbox, model: handle.model, sink, signal: handle.signal, log,
          argv: harnessArgv(acpHarness, acpSetting.command, sandbox.driver, acpSetting.args) ?? [],
          routingKey: spec.agent.routing_key,
          ...(spec.agent.system ? { instructions: spec.agent.system } : {}),
          history: spec.history,
          max_duration_seconds: spec.environment.resources.max_duration_seconds,
          gate: (q) => handle.checkTool({ ...q, tool_use_id: sink.toolId(q.tool_use_id) }),
          ...(spec.runtime_mcp ? { mcp: { baseUrl: o.baseUrl, bearer: spec.runtime_mcp.bearer, servers: spec.runtime_mcp.servers } } : {}),
          sessions: o.acpSessions ?? (o.acpSessions = new Map()),
        });
      }
      if (spec.environment.harness_topology === 'colocated') {
        // The agent loop runs inside the sandbox; this runner relays (./colocated.ts).
        return runColocated({
          driver, sandbox, model: handle.model, sink, signal: handle.signal, log,
          // The same ActionPolicy check as split; the runner holds the in-sandbox loop to each decision.
          gate: (q) => handle.checkTool({ ...q, tool_use_id: sink.toolId(q.tool_use_id) }),
          run: { agent, history: spec.history, ...(spec.responses ? { responses: spec.responses } : {}), max_duration_seconds: spec.environment.resources.max_duration_seconds },
          ...(spec.environment.browser ? { browser: true, storeFile: runtimeFileStore(o.baseUrl, spec.runtime_files?.bearer, handle.signal) } : {}),
        });
      } else {
        const loop = new HarnessLoop({
          model: handle.model, driver, sandbox, sink, logger: log, ...(tracingEnabled() ? { traceTool } : {}),
          ...(browser ? { browser, storeFile: runtimeFileStore(o.baseUrl, spec.runtime_files?.bearer, handle.signal) } : {}),
          // The control plane decides each tool use before it runs (ActionPolicies); ids as the Session sees them.
          gate: (q) => handle.checkTool({ ...q, tool_use_id: sink.toolId(q.tool_use_id) }),
        });
        return loop.run({
          agent,
          history: spec.history,
          ...(spec.responses ? { responses: spec.responses } : {}),
          session_thread_id: spec.thread_id,
          signal: handle.signal,
          max_duration_seconds: spec.environment.resources.max_duration_seconds,
        });
      }
    };
    try {
      // The harness loop as one GenAI agent span (its model steps and tools are children).
      outcome = await inSpan('invoke_agent', {
        attributes: {
          [ATTR.genAiOperationName]: 'invoke_agent', [ATTR.genAiRequestModel]: spec.agent.routing_key, 'agentplane.run.id': spec.run_id,
          'agentplane.harness.topology': acpSetting ? 'acp' : spec.environment.harness_topology ?? 'split',
        },
      }, async (span) => {
        const out = await runHarness();
        span.setAttribute('agentplane.stop_reason', out.stop_reason.type);
        return out;
      });
    } catch (err) {
      // A spent budget ends the turn with its own stop reason instead of failing the Run.
      if (err instanceof HarnessError && err.modelError?.type === 'budget.exceeded') {
        return { stop_reason: { type: 'budget_exceeded', message: err.modelError.message } };
      }
      // The sandbox went away under the Run (its container removed from outside the runner, the
      // engine gone): whatever the harness made of it, the Run is retried rather than its turn ended.
      // The driver (split) and the colocated relay waited for a removal under way already; an ACP
      // agent cut off by one is given the driver's grace here.
      if (!handle.signal.aborted && (await o.sandboxes.driver.lost?.(sandbox, acpSetting ? undefined : 0).catch(() => false))) {
        throw new InfrastructureFailure(`the sandbox went away during the Run: ${err instanceof Error ? err.message : String(err)}`, { cause: err });
      }
      throw err;
    } finally {
      await mcp?.close();
      await browser?.close();
    }
    const stop = outcome.stop_reason;
    if (stop.type === 'requires_action') {
      const ids = stop.tool_use_ids.map((id) => sink.toolId(id));
      // The colocated relay knows what answers each use by the runner's own policy; split asks the sink.
      const kind = (raw: string): string | undefined => outcome.awaiting?.get(raw) ?? sink.awaiting.get(sink.toolId(raw));
      return {
        stop_reason: { type: 'requires_action', tool_use_ids: ids },
        waits: stop.tool_use_ids.map((raw) => ({ tool_use_id: sink.toolId(raw), kind: waitKind(kind(raw)) })),
        usage: outcome.usage,
      };
    }
    return { stop_reason: stop, usage: outcome.usage };
  } finally {
    o.sandboxes.runEnded(spec.sandbox_id ?? spec.session_id);
  }
}
