/**
 * The ACP harness, runner side (docs/ACP.md): for one Run the runner starts the Environment's
 * ACP agent inside the Session's sandbox with open stdio and is its ACP client, with the official
 * SDK (`@agentclientprotocol/sdk`):
 *
 * - `initialize`, then `session/load` of the Session's earlier ACP session when the agent
 *   supports it (else `session/new`, cwd = the workspace, the Session's MCP servers through the
 *   model endpoint's runtime MCP proxy), then `session/prompt` with the turn's user message;
 * - every `session/update` becomes Session events: message and thought chunks → `agent.message`
 *   / `agent.thinking` (one event per contiguous run of chunks; previews come from the model
 *   relay's deltas), tool calls → `agent.tool_use`, their completion → `agent.tool_result`, plans
 *   → `agent.plan`;
 * - `session/request_permission` is the control plane's ActionPolicy check of the tool call
 *   (`tool.check`, fail closed): allow → the agent's allow option, deny → its reject option and
 *   the refusal as the tool's result; `require_approval` holds the request open and asks again
 *   until the ActionApproval is resolved (approved → allow, denied or expired → deny);
 * - `fs/*` and `terminal/*` are served inside the sandbox, confined to the workspace;
 * - models: the agent's Anthropic- or OpenAI-compatible client is pointed at the sandbox's
 *   loopback (`./forwarder.ts` → `./model-endpoint.ts` → the lease's model gateway);
 * - `user.interrupt` (the lease signal) sends `session/cancel`; an agent that has not ended the
 *   prompt within the cancel bound is killed with everything it started.
 *
 * An agent that exits, breaks the protocol or fails the prompt ends the Run as a work failure;
 * the sandbox stays for the next turn.
 */
import { randomBytes } from 'node:crypto';
import { Readable, Writable } from 'node:stream';
import * as acp from '@agentclientprotocol/sdk';
import type { Logger } from '@agentplane/core';
import { addUsage, ZERO_USAGE, type ModelClient, type ModelError, type ModelMessage, type TokenUsage } from '@agentplane/protocol';
import { HarnessError, type HarnessEvent, type IdleStopReason, type PlanEvent, type SessionEventSink } from '../harness/events.js';
import { policyRefusal, type GateDecision, type GateQuery, type ToolGate } from '../harness/loop.js';
import type { Sandbox, SandboxDriver, SandboxProcess } from '../sandbox/types.js';
import { bridgeForwarder, FORWARDER_SOURCE } from './forwarder.js';
import { QUIET_AGENT_ENV } from './install.js';
import { startModelEndpoint } from './model-endpoint.js';
import { mcpProxy, type McpCallCheck, type RuntimeMcpGrant } from './mcp-proxy.js';
import { Terminals, confinedPath, readConfined, writeConfined } from './sandbox-io.js';

/** What the sink receives beyond the built-in loop's events. */
export type AcpEvent = Exclude<HarnessEvent, { type: 'session.status_idle' }> | PlanEvent;

export interface AcpSink extends Omit<SessionEventSink, 'emit'> {
  emit(event: AcpEvent): Promise<void>;
}

export interface AcpRunOptions {
  driver: SandboxDriver;
  sandbox: Sandbox;
  model: ModelClient;
  sink: AcpSink;
  signal: AbortSignal;
  log: Logger;
  /** The agent's command inside the sandbox. */
  argv: string[];
  routingKey: string;
  /** The Agent's system prompt: added to every model step the agent makes. */
  instructions?: string;
  history: ModelMessage[];
  max_duration_seconds?: number;
  gate?: ToolGate;
  /** The Session's MCP servers through the control plane's runtime MCP endpoint. */
  mcp?: RuntimeMcpGrant;
  /** ACP session ids of earlier Runs, by Session (continued with `session/load`). */
  sessions: Map<string, string>;
  /** Bound between `session/cancel` and the kill. Default 3 s. */
  cancelTimeoutMs?: number;
  /** How often a `require_approval` is asked again. Default 1 s. */
  approvalPollMs?: number;
}

export interface AcpOutcome {
  stop_reason: IdleStopReason;
  usage: TokenUsage;
}

export class AcpHarnessError extends Error {
  constructor(
    readonly reason: 'agent_exited' | 'agent_failed' | 'start_failed',
    message: string,
    options?: { cause?: unknown },
  ) {
    super(message, options);
    this.name = 'AcpHarnessError';
  }
}

const DEADLINE_GRACE_MS = 10_000;
/** After a finished prompt, how long the agent has to exit by itself before it is killed. */
const EXIT_GRACE_MS = 250;
/** The model endpoint's port on a Docker sandbox's own loopback. */
export const SANDBOX_MODEL_PORT = 41_977;
/** The shutdown of each sandbox's last agent (the next Run of that sandbox waits for it). */
const cleanups = new Map<string, Promise<void>>();

/** ACP tool kinds as the built-in tools ActionPolicies already name. */
const TOOL_NAMES: Record<string, string> = { execute: 'bash', read: 'read', edit: 'edit', delete: 'write', move: 'write', search: 'grep' };

type Json = Record<string, unknown>;

interface ToolState {
  id: string;
  name: string;
  title: string;
  input: unknown;
  emitted: boolean;
  done: boolean;
}

/**
 * The turn's new input: the last run of user messages that carry text (what the user said since
 * the agent last answered). What precedes it is earlier conversation; what follows it is the
 * partial work of an attempt that was lost (a rescheduled Run), given as context.
 */
function promptOf(history: ModelMessage[]): { texts: string[]; earlier: ModelMessage[]; partial: ModelMessage[] } {
  const hasText = (m: ModelMessage | undefined): boolean => m?.role === 'user' && m.content.some((b) => b.type === 'text');
  let end = history.length;
  while (end > 0 && !hasText(history[end - 1])) end -= 1;
  let start = end;
  while (start > 0 && history[start - 1]?.role === 'user') start -= 1;
  const texts = history.slice(start, end).map((m) => m.content.flatMap((b) => (b.type === 'text' ? [b.text] : [])).join('\n\n')).filter(Boolean);
  return { texts, earlier: history.slice(0, start), partial: history.slice(end) };
}

function transcript(messages: ModelMessage[]): string {
  return messages
    .map((m) => `${m.role}: ${m.content.map((b) => (b.type === 'text' ? b.text : b.type === 'tool_use' ? `[tool ${b.name}]` : b.type === 'tool_result' ? `[result] ${b.content.slice(0, 2000)}` : '')).join(' ')}`)
    .join('\n');
}

function contentText(items: unknown): string {
  if (!Array.isArray(items)) return '';
  const parts: string[] = [];
  for (const it of items as Json[]) {
    if (it.type === 'content') {
      const c = (it.content ?? {}) as Json;
      if (c.type === 'text' && typeof c.text === 'string') parts.push(c.text);
      else if (c.type === 'resource_link' && typeof c.uri === 'string') parts.push(c.uri);
    } else if (it.type === 'diff') parts.push(`diff ${String(it.path)}`);
    else if (it.type === 'terminal') parts.push(`terminal ${String(it.terminalId)}`);
  }
  return parts.join('\n');
}

function toolInput(kind: string | null | undefined, raw: unknown, title: string): unknown {
  const input = raw && typeof raw === 'object' ? { ...(raw as Json) } : raw === undefined || raw === null ? {} : { value: raw };
  if (kind === 'execute' && typeof (input as Json).command !== 'string') {
    const c = (input as Json).command;
    (input as Json).command = Array.isArray(c) ? c.join(' ') : title;
  }
  return input;
}

const sleep = (ms: number, signal: AbortSignal): Promise<void> =>
  new Promise((resolve) => {
    const t = setTimeout(resolve, ms);
    signal.addEventListener('abort', () => {
      clearTimeout(t);
      resolve();
    }, { once: true });
  });

/** Runs one Run with the Environment's ACP agent. */
export async function runAcp(o: AcpRunOptions): Promise<AcpOutcome> {
  return new AcpRun(o).run();
}

class AcpRun {
  private usage: TokenUsage = { ...ZERO_USAGE };
  /** The last gateway error a model step ended with (a spent budget ends the turn as such). */
  private modelError: ModelError | undefined;
  private readonly tools = new Map<string, ToolState>();
  private pending: { kind: 'text' | 'thinking'; text: string } | null = null;
  private chain: Promise<void> = Promise.resolve();
  /** While `session/load` replays history, updates are not news. */
  private replaying = false;
  private readonly key = `ap-lease-${randomBytes(18).toString('hex')}`;
  private stderr = '';
  private readonly stop = new AbortController();
  private readonly t0 = performance.now();
  /** Debug timing of the Run's phases (what `bench:acp` reads to explain its figure). */
  private phase(name: string): void {
    this.o.log.debug({ session: this.o.sandbox.sessionId, phase: name, ms: Number((performance.now() - this.t0).toFixed(1)) }, 'acp phase');
  }
  /** The model endpoint as the agent reaches it (the sandbox's loopback). */
  private base = '';

  constructor(private readonly o: AcpRunOptions) {}

  /** The first event that could not be delivered: the Run fails with it at its end. */
  private undelivered: unknown = undefined;

  /**
   * Events go out in order; a failed delivery fails the Run. Most callers do not wait on the
   * returned promise: the Run's end rethrows the first failure (`delivered`).
   */
  private emit(event: AcpEvent): Promise<void> {
    // Past a failure nothing more is sent (each would wait out the same delivery deadline).
    const next = this.chain.then(() => (this.undelivered === undefined ? this.o.sink.emit(event) : Promise.reject(this.undelivered)));
    this.chain = next.catch((err: unknown) => {
      this.undelivered ??= err;
    });
    return next;
  }

  /** Every event emitted so far has been delivered, or the first failure is thrown. */
  private async delivered(): Promise<void> {
    await this.chain;
    if (this.undelivered !== undefined) throw this.undelivered;
  }

  private flush(): Promise<void> {
    const p = this.pending;
    this.pending = null;
    if (!p || !p.text) return this.chain;
    return p.kind === 'text'
      ? this.emit({ type: 'agent.message', payload: { content: [{ type: 'text', text: p.text }] } })
      : this.emit({ type: 'agent.thinking', payload: { content: [{ type: 'thinking', text: p.text }] } });
  }

  private chunk(kind: 'text' | 'thinking', text: string): void {
    if (this.pending && this.pending.kind !== kind) void this.flush();
    if (!this.pending) this.pending = { kind, text: '' };
    this.pending.text += text;
  }

  private toolUse(call: { toolCallId: string; title?: string | null; kind?: string | null; rawInput?: unknown; name?: string | null }): ToolState {
    let t = this.tools.get(call.toolCallId);
    if (!t) {
      const title = call.title ?? call.name ?? 'tool';
      t = { id: call.toolCallId, name: TOOL_NAMES[call.kind ?? ''] ?? `acp_${call.kind ?? 'other'}`, title, input: toolInput(call.kind, call.rawInput, title), emitted: false, done: false };
      this.tools.set(call.toolCallId, t);
    } else if (call.rawInput !== undefined && !t.emitted) t.input = toolInput(call.kind, call.rawInput, t.title);
    if (!t.emitted) {
      t.emitted = true;
      void this.flush();
      const input = t.input && typeof t.input === 'object' ? { ...(t.input as Json), _acp: { title: t.title, kind: call.kind ?? 'other' } } : t.input;
      void this.emit({ type: 'agent.tool_use', payload: { id: t.id, name: t.name, input, blocking: false } });
    }
    return t;
  }

  private toolResult(t: ToolState, payload: { content: string; is_error: boolean; denied?: boolean; policy_rule_id?: string }): void {
    if (t.done) return;
    t.done = true;
    void this.emit({ type: 'agent.tool_result', payload: { tool_use_id: t.id, ...payload } });
  }

  private update(u: acp.SessionUpdate): void {
    if (this.replaying) return;
    switch (u.sessionUpdate) {
      case 'agent_message_chunk':
        if (u.content.type === 'text') this.chunk('text', u.content.text);
        return;
      case 'agent_thought_chunk':
        if (u.content.type === 'text') this.chunk('thinking', u.content.text);
        return;
      case 'tool_call':
        this.toolUse(u);
        if (u.status === 'completed' || u.status === 'failed') {
          const t = this.tools.get(u.toolCallId);
          if (t) this.toolResult(t, { content: contentText(u.content) || (u.rawOutput === undefined ? '' : JSON.stringify(u.rawOutput)), is_error: u.status === 'failed' });
        }
        return;
      case 'tool_call_update': {
        const t = this.toolUse(u);
        if (u.status === 'completed' || u.status === 'failed') {
          this.toolResult(t, { content: contentText(u.content) || (u.rawOutput === undefined ? '' : typeof u.rawOutput === 'string' ? u.rawOutput : JSON.stringify(u.rawOutput)), is_error: u.status === 'failed' });
        }
        return;
      }
      case 'plan':
        void this.flush();
        void this.emit({ type: 'agent.plan', payload: { entries: u.entries.map((e) => ({ content: e.content, priority: e.priority, status: e.status })) } });
        return;
      default:
        return;
    }
  }

  /**
   * The control plane's ActionPolicies on one tool use; an open ActionApproval is waited for
   * (polled) while the Run lasts. A failed check denies (fail closed).
   */
  private async decide(q: GateQuery): Promise<GateDecision> {
    const ask = async (): Promise<GateDecision> => {
      if (!this.o.gate) return { decision: 'allow', rule_id: null, message: 'no ActionPolicies on this runner' };
      try {
        return await this.o.gate(q);
      } catch (err) {
        return { decision: 'deny', rule_id: null, message: `the policy check failed (${err instanceof Error ? err.message : String(err)}); denied (fail closed)` };
      }
    };
    let d = await ask();
    while (d.decision === 'require_approval' && !this.o.signal.aborted && !this.stop.signal.aborted) {
      await sleep(this.o.approvalPollMs ?? 1000, AbortSignal.any([this.o.signal, this.stop.signal]));
      if (this.o.signal.aborted || this.stop.signal.aborted) break;
      d = await ask();
    }
    return d;
  }

  /**
   * A `tools/call` the agent sends to one of the Run's MCP servers: null to send it, else the
   * refusal it gets. The runtime bearer allows every call of a granted Connection; the built-in
   * loop asks before calling, and here the same rules hold: an `always_ask` tool needs a
   * confirmation an ACP agent's call cannot wait for, and the ActionPolicies decide the rest.
   */
  private readonly mcpCall: McpCallCheck = async (server, call) => {
    if (server.permission !== 'always_allow') {
      return `Not run: tool '${call.name}' of the MCP server '${server.name}' is always_ask (each call needs the user's confirmation), which a call from an ACP agent cannot wait for.`;
    }
    const d = await this.decide({ tool_use_id: `mcp_${randomBytes(12).toString('hex')}`, tool: { kind: 'mcp', name: call.name, connection_id: server.connection_id }, input: call.arguments });
    if (this.o.signal.aborted || this.stop.signal.aborted) return 'Interrupted before the tool ran.';
    return d.decision === 'allow' ? null : policyRefusal(d);
  };

  /** `session/request_permission`: the control plane's ActionPolicy decides. */
  private async permission(p: acp.RequestPermissionRequest): Promise<acp.RequestPermissionResponse> {
    const t = this.toolUse({ ...p.toolCall, title: p.toolCall.title ?? null });
    await this.flush();
    await this.chain;
    const q: GateQuery = { tool_use_id: t.id, tool: { kind: 'builtin', name: t.name }, input: t.input };
    this.phase('permission asked');
    const d = await this.decide(q);
    this.phase('permission answered');
    if (this.o.signal.aborted || this.stop.signal.aborted) return { outcome: { outcome: 'cancelled' } };
    if (d.decision === 'allow') {
      const opt = p.options.find((x) => x.kind === 'allow_once') ?? p.options.find((x) => x.kind === 'allow_always');
      return opt ? { outcome: { outcome: 'selected', optionId: opt.optionId } } : { outcome: { outcome: 'cancelled' } };
    }
    this.toolResult(t, { content: policyRefusal(d), is_error: true, denied: true, ...(d.rule_id ? { policy_rule_id: d.rule_id } : {}) });
    await this.chain;
    const opt = p.options.find((x) => x.kind === 'reject_once') ?? p.options.find((x) => x.kind === 'reject_always');
    return opt ? { outcome: { outcome: 'selected', optionId: opt.optionId } } : { outcome: { outcome: 'cancelled' } };
  }

  async run(): Promise<AcpOutcome> {
    const { o } = this;
    const endpoint = await startModelEndpoint({
      model: o.model, routingKey: o.routingKey, key: this.key, ...(o.instructions ? { instructions: o.instructions } : {}), signal: AbortSignal.any([o.signal, this.stop.signal]),
      onUsage: (u) => (this.usage = addUsage(this.usage, u)),
      onError: (e) => (this.modelError = e),
      onStep: (t) => o.log.debug({ session: o.sandbox.sessionId, first_event_ms: Number(t.first_event_ms.toFixed(3)), total_ms: Number(t.total_ms.toFixed(3)) }, 'acp model step'),
      ...(o.mcp ? { extra: mcpProxy(o.mcp, this.stop.signal, this.mcpCall) } : {}),
    });
    let forwarder: SandboxProcess | undefined;
    let agent: SandboxProcess | undefined;
    const terminals = new Terminals(o.driver, o.sandbox);
    const docker = o.sandbox.driver === 'docker';
    // The previous Run's agent of this sandbox is gone before this one starts.
    await cleanups.get(o.sandbox.sessionId);
    try {
      // In a Docker sandbox the loopback is the sandbox's own: the forwarder takes a fixed port and
      // starts alongside the agent. The process driver shares the host's loopback: any free port.
      forwarder = await o.driver.spawn(o.sandbox, ['node', '-e', FORWARDER_SOURCE], { env: { AGENTPLANE_MODEL_PORT: docker ? String(SANDBOX_MODEL_PORT) : '0' } });
      const listening = bridgeForwarder(forwarder, endpoint.port, {
        onFailure: (err) => o.log.warn({ session: o.sandbox.sessionId, err: err.message }, 'the model forwarder was stopped: the agent has no model endpoint for the rest of this Run'),
      });
      listening.catch(() => undefined);
      const port = docker ? SANDBOX_MODEL_PORT : await listening;
      const base = `http://127.0.0.1:${port}`;
      this.base = base;
      const home = docker ? '/tmp/agentplane-acp-home' : `${o.sandbox.workspace}/.agentplane-acp-home`;
      const env: Record<string, string> = {
        ...QUIET_AGENT_ENV,
        HOME: home,
        ANTHROPIC_BASE_URL: base,
        ANTHROPIC_API_KEY: this.key,
        ANTHROPIC_MODEL: o.routingKey,
        ANTHROPIC_SMALL_FAST_MODEL: o.routingKey,
        OPENAI_BASE_URL: `${base}/v1`,
        OPENAI_API_KEY: this.key,
        AGENTPLANE_MODEL: o.routingKey,
      };
      const argv = docker ? ['bash', '-c', 'mkdir -p -- "$HOME" && exec "$@"', 'acp-agent', ...o.argv] : o.argv;
      agent = await o.driver.spawn(o.sandbox, argv, { cwd: o.sandbox.workspace, env });
      this.phase('spawned');
      return await this.converse(agent, terminals, listening.then(() => undefined));
    } finally {
      this.stop.abort();
      // The agent is let go after the Run has its answer: it gets a moment to exit on end of input,
      // then goes (ACP agents keep what they need between turns on disk as they work).
      const a = agent;
      const f = forwarder;
      const cleanup = (async () => {
        await terminals.closeAll();
        if (a) {
          a.stdin.end();
          const exited = await Promise.race([a.wait().then(() => true), new Promise<false>((r) => setTimeout(() => r(false), EXIT_GRACE_MS).unref())]);
          if (!exited) await a.kill().catch(() => undefined);
        }
        if (f) {
          f.stdin.end();
          await f.kill().catch(() => undefined);
        }
        await endpoint.close();
      })().catch(() => undefined).finally(() => {
        if (cleanups.get(o.sandbox.sessionId) === cleanup) cleanups.delete(o.sandbox.sessionId);
      });
      cleanups.set(o.sandbox.sessionId, cleanup);
    }
  }

  private async converse(agent: SandboxProcess, terminals: Terminals, endpointReady: Promise<void>): Promise<AcpOutcome> {
    const { o } = this;
    agent.stderr.on('data', (c: Buffer) => (this.stderr = (this.stderr + c.toString('utf8')).slice(-4000)));
    const exited = agent.wait();
    const app = acp.client({ name: 'agentplane' })
      .onNotification(acp.methods.client.session.update, ({ params }) => {
        this.update(params.update);
      })
      .onRequest(acp.methods.client.session.requestPermission, ({ params }) => this.permission(params))
      .onRequest(acp.methods.client.fs.readTextFile, async ({ params }) => {
        const content = await readConfined(o.driver, o.sandbox, params.path);
        const lines = content.split('\n');
        const from = Math.max(0, (params.line ?? 1) - 1);
        return { content: params.line || params.limit ? lines.slice(from, params.limit ? from + params.limit : undefined).join('\n') : content };
      })
      .onRequest(acp.methods.client.fs.writeTextFile, async ({ params }) => {
        await writeConfined(o.driver, o.sandbox, params.path, params.content);
        return {};
      })
      .onRequest(acp.methods.client.terminal.create, async ({ params }) => {
        const cwd = params.cwd ? await confinedPath(o.driver, o.sandbox, params.cwd) : o.sandbox.workspace;
        const env = Object.fromEntries((params.env ?? []).map((e) => [e.name, e.value]));
        return { terminalId: await terminals.create(params.command, params.args ?? [], cwd, env, params.outputByteLimit ?? undefined) };
      })
      .onRequest(acp.methods.client.terminal.output, ({ params }) => terminals.output(params.terminalId))
      .onRequest(acp.methods.client.terminal.waitForExit, ({ params }) => terminals.waitForExit(params.terminalId))
      .onRequest(acp.methods.client.terminal.kill, async ({ params }) => {
        await terminals.kill(params.terminalId);
        return {};
      })
      .onRequest(acp.methods.client.terminal.release, async ({ params }) => {
        await terminals.release(params.terminalId);
        return {};
      });
    const stream = acp.ndJsonStream(Writable.toWeb(agent.stdin) as WritableStream<Uint8Array>, Readable.toWeb(agent.stdout) as ReadableStream<Uint8Array>);

    type Ending = { kind: 'stop'; reason: acp.StopReason } | { kind: 'exit'; code: number } | { kind: 'error'; err: unknown } | { kind: 'killed' } | { kind: 'deadline' };
    let settle!: (e: Ending) => void;
    const ended = new Promise<Ending>((r) => (settle = r));
    const timers: NodeJS.Timeout[] = [];
    void exited.then(({ exitCode }) => settle({ kind: 'exit', code: exitCode }));

    const conversation = app.connectWith(stream, async (cx) => {
      const init = await cx.request(acp.methods.agent.initialize, {
        protocolVersion: acp.PROTOCOL_VERSION,
        clientCapabilities: { fs: { readTextFile: true, writeTextFile: true }, terminal: true },
        clientInfo: { name: 'agentplane', version: '1' },
      });
      this.phase('initialized');
      const caps = init.agentCapabilities ?? {};
      const mcpServers: acp.McpServer[] = o.mcp && caps.mcpCapabilities?.http
        ? o.mcp.servers.map((s) => ({ type: 'http' as const, name: s.name, url: `${this.base}/mcp/${encodeURIComponent(s.name)}`, headers: [{ name: 'Authorization', value: `Bearer ${this.key}` }] }))
        : [];
      const { texts, earlier, partial } = promptOf(o.history);
      let sessionId = o.sessions.get(o.sandbox.sessionId);
      let loaded = false;
      if (sessionId && caps.loadSession) {
        this.replaying = true;
        try {
          await cx.request(acp.methods.agent.session.load, { sessionId, cwd: o.sandbox.workspace, mcpServers });
          loaded = true;
        } catch (err) {
          o.log.info({ err: err instanceof Error ? err.message : String(err) }, 'the ACP agent could not load its earlier session; starting a new one');
        } finally {
          this.replaying = false;
        }
      }
      if (!loaded) {
        sessionId = (await cx.request(acp.methods.agent.session.new, { cwd: o.sandbox.workspace, mcpServers })).sessionId;
        o.sessions.set(o.sandbox.sessionId, sessionId);
      }
      const sid = sessionId as string;
      this.phase('session');
      // The agent's first model call may follow the prompt at once: the forwarder must listen.
      await endpointReady;
      this.phase('endpoint');
      const prompt: acp.ContentBlock[] = [];
      if (!loaded && earlier.length > 0) prompt.push({ type: 'text', text: `The conversation so far:\n${transcript(earlier)}\n\nThe new message follows.` });
      if (partial.length > 0) prompt.push({ type: 'text', text: `An earlier attempt at this message was cut off after:\n${transcript(partial)}` });
      // One block per user message, the newest last.
      for (const t of texts.length > 0 ? texts : ['(no message)']) prompt.push({ type: 'text', text: t });

      const onAbort = (): void => {
        void cx.notify(acp.methods.agent.session.cancel, { sessionId: sid }).catch(() => undefined);
        timers.push(setTimeout(() => settle({ kind: 'killed' }), o.cancelTimeoutMs ?? 3000));
      };
      if (o.signal.aborted) onAbort();
      else o.signal.addEventListener('abort', onAbort, { once: true });
      if (o.max_duration_seconds) {
        timers.push(setTimeout(() => {
          void cx.notify(acp.methods.agent.session.cancel, { sessionId: sid }).catch(() => undefined);
          timers.push(setTimeout(() => settle({ kind: 'deadline' }), o.cancelTimeoutMs ?? 3000));
        }, o.max_duration_seconds * 1000 + DEADLINE_GRACE_MS));
      }
      try {
        const res = await cx.request(acp.methods.agent.session.prompt, { sessionId: sid, prompt });
        this.phase('prompted');
        settle({ kind: 'stop', reason: res.stopReason });
      } finally {
        o.signal.removeEventListener('abort', onAbort);
      }
    }).catch((err: unknown) => settle({ kind: 'error', err }));

    const ending = await ended;
    for (const t of timers) clearTimeout(t);
    await this.flush().catch(() => undefined);
    await this.chain;
    // A connection that broke is usually an agent that died: give its exit a moment to show.
    const gone = ending.kind === 'error' ? await Promise.race([agent.wait(), new Promise<null>((r) => setTimeout(() => r(null), 1000).unref())]) : null;
    if (ending.kind !== 'stop' && ending.kind !== 'exit') {
      // Not a clean end: the agent and everything it started go now (the sandbox stays).
      o.log.warn({ session: o.sandbox.sessionId, why: ending.kind }, 'stopping the ACP agent');
      await agent.kill().catch(() => undefined);
    }
    void conversation;
    // Tool calls the agent never finished are answered, so the log shows no dangling use.
    for (const t of this.tools.values()) {
      if (t.emitted && !t.done) this.toolResult(t, { content: o.signal.aborted ? 'Interrupted before the tool finished.' : 'The agent ended the turn before the tool finished.', is_error: true });
    }
    await this.delivered();
    const interrupted = o.signal.aborted;
    // A spent budget ends the turn with its own stop reason, however the agent took the refusal.
    if (!interrupted && this.modelError?.type === 'budget.exceeded') throw new HarnessError('model_error', this.modelError.message, this.modelError);
    switch (ending.kind) {
      case 'stop': {
        const map: Record<acp.StopReason, IdleStopReason> = {
          end_turn: { type: 'end_turn' }, max_tokens: { type: 'max_tokens' }, max_turn_requests: { type: 'max_steps' }, refusal: { type: 'refusal' }, cancelled: { type: 'interrupted' },
        };
        return { stop_reason: interrupted ? { type: 'interrupted' } : (map[ending.reason] ?? { type: 'end_turn' }), usage: this.usage };
      }
      case 'killed':
        return { stop_reason: { type: 'interrupted' }, usage: this.usage };
      case 'deadline':
        return { stop_reason: { type: 'max_duration' }, usage: this.usage };
      case 'exit':
        if (interrupted) return { stop_reason: { type: 'interrupted' }, usage: this.usage };
        throw new AcpHarnessError('agent_exited', `the ACP agent exited with code ${ending.code} before it finished the turn${this.stderr.trim() ? `: ${this.stderr.trim().slice(-1000)}` : ''}`);
      case 'error': {
        if (interrupted) return { stop_reason: { type: 'interrupted' }, usage: this.usage };
        if (gone && !gone.killed) {
          throw new AcpHarnessError('agent_exited', `the ACP agent exited with code ${gone.exitCode} before it finished the turn${this.stderr.trim() ? `: ${this.stderr.trim().slice(-1000)}` : ''}`);
        }
        const msg = ending.err instanceof Error ? ending.err.message : JSON.stringify(ending.err);
        throw new AcpHarnessError('agent_failed', `the ACP agent failed the turn: ${msg}${this.stderr.trim() ? ` (stderr: ${this.stderr.trim().slice(-500)})` : ''}`, { cause: ending.err });
      }
    }
  }

}

/** The probe: the agent started in `sandbox` answers ACP `initialize` within the bound. */
export async function probeInitialize(driver: SandboxDriver, sandbox: Sandbox, argv: string[], timeoutMs = 60_000): Promise<void> {
  const proc = await driver.spawn(sandbox, argv, { cwd: sandbox.workspace, env: { ...QUIET_AGENT_ENV, HOME: sandbox.driver === 'docker' ? '/tmp' : sandbox.workspace } });
  let stderr = '';
  proc.stderr.on('data', (c: Buffer) => (stderr = (stderr + c.toString('utf8')).slice(-2000)));
  const stream = acp.ndJsonStream(Writable.toWeb(proc.stdin) as WritableStream<Uint8Array>, Readable.toWeb(proc.stdout) as ReadableStream<Uint8Array>);
  let timer: NodeJS.Timeout | undefined;
  try {
    await Promise.race([
      acp.client({ name: 'agentplane-probe' }).connectWith(stream, async (cx) => {
        await cx.request(acp.methods.agent.initialize, { protocolVersion: acp.PROTOCOL_VERSION, clientCapabilities: { fs: { readTextFile: true, writeTextFile: true }, terminal: true } });
      }),
      proc.wait().then(({ exitCode }) => {
        throw new Error(`the agent exited with code ${exitCode} before it answered initialize: ${stderr.trim()}`);
      }),
      new Promise<never>((_, reject) => (timer = setTimeout(() => reject(new Error(`no answer to initialize within ${timeoutMs} ms: ${stderr.trim()}`)), timeoutMs))),
    ]);
  } finally {
    clearTimeout(timer);
    proc.stdin.end();
    await proc.kill().catch(() => undefined);
  }
}
