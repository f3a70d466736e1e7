/**
 * The colocated topology, runner side: the agent loop runs inside the sandbox
 * (`harness/colocated/main.ts`, bundled) and the runner only relays. It places the bundle in the
 * sandbox's tmpfs, starts `node` with open stdio, and then, line by line:
 *
 * - model steps go to the lease's model gateway (the sandbox has no network), with the agent's
 *   routing key whatever the harness asked for; usage is counted from the gateway's answers;
 * - every tool use is put to the control plane's ActionPolicies (`tool.check` on the lease, fail
 *   closed) when the harness asks, about the use as the runner saw the model make it; the
 *   harness may then report it only as that decision allows (`audit.ts`);
 * - MCP tool calls are made by the runner, only for tool uses the model made, that the policy
 *   check allowed and, for `always_ask` tools, only once the user allowed them;
 * - events are checked (`validate.ts`, `audit.ts`) and appended through the lease sink, each
 *   acknowledged before the next line is read;
 * - `user.interrupt` (the lease signal) becomes an `abort` line; a harness that has not stopped
 *   within the cancel bound is killed with everything it started.
 *
 * A harness that writes anything else, dies, or stops without `done` ends the Run as a work
 * failure with the reason; its processes are killed.
 */
import { createHash } from 'node:crypto';
import { existsSync } from 'node:fs';
import { readFile } from 'node:fs/promises';
import { fileURLToPath } from 'node:url';
import type { Logger } from '@agentplane/core';
import { addUsage, RUNNER_DEFAULTS, ZERO_USAGE, type ModelClient, type ModelError, type ModelRequest, type TokenUsage } from '@agentplane/protocol';
import { HarnessError, type AgentConfig, type Awaiting, type IdleStopReason, type SessionEventSink } from '../harness/events.js';
import type { GateDecision, GateQuery, RunInput, ToolGate } from '../harness/loop.js';
import { RunAudit } from '../harness/colocated/audit.js';
import { encodeLine, HARNESS_SANDBOX_PATH, LineSplitter, RelayError, type HarnessMessage, type RelayTool, type RunnerMessage } from '../harness/colocated/protocol.js';
import { parseHarnessLine } from '../harness/colocated/validate.js';
import type { Sandbox, SandboxDriver, SandboxProcess } from '../sandbox/types.js';
import type { FileStore } from '../harness/tools/types.js';
import { pngSize } from '../harness/tools/browser-session.js';
import { OutputTail } from '../sandbox/output.js';
import { InfrastructureFailure } from '../failures.js';

/** The bundle `npm run build` writes (runner-daemon/dist/colocated/harness.mjs; the same path from src/ and dist/). */
export const HARNESS_BUNDLE_URL = new URL('../../dist/colocated/harness.mjs', import.meta.url);

/** Whether this runner's build carries the harness bundle (else it refuses colocated offers). */
export function colocatedHarnessAvailable(bundle: URL = HARNESS_BUNDLE_URL): boolean {
  return existsSync(fileURLToPath(bundle));
}

/** Longest MCP tool result handed to the harness (its tool_result event must fit one event batch). */
const MAX_TOOL_RESULT_CHARS = 256 * 1024;
/** Model streams one harness may have open at once (one step, plus one being canceled). */
const MAX_OPEN_STREAMS = 2;
/** Unprocessed lines before the runner stops reading the harness's stdout. */
const READ_AHEAD_LINES = 64;
/** Past the Run's max duration, how long the harness gets to stop by itself. */
const DEADLINE_GRACE_MS = 10_000;
/** Largest model request forwarded: it travels as one runner frame, and a larger frame would close the runner's socket. */
const MAX_MODEL_REQUEST_BYTES = RUNNER_DEFAULTS.maxFrameBytes - 16 * 1024;
/** Log lines taken from one harness per Run (the rest are dropped). */
const MAX_LOG_LINES = 200;

export interface ColocatedRunOptions {
  driver: SandboxDriver;
  sandbox: Sandbox;
  /** The lease's model gateway client. */
  model: ModelClient;
  /** Where validated events go (the lease sink). */
  sink: SessionEventSink;
  /** The lease's signal: `user.interrupt`, lease lost, drain deadline. */
  signal: AbortSignal;
  log: Logger;
  run: Omit<RunInput, 'signal' | 'session_thread_id'> & { agent: AgentConfig };
  /**
   * The ActionPolicy check (the lease's `tool.check`). Present: the harness must have every tool
   * use checked before it reports it, and the runner holds it to the decision. Absent: no
   * governance (every check is allowed).
   */
  gate?: ToolGate;
  /** How long an aborted harness has to stop before it is killed. Default 3 s. */
  cancelTimeoutMs?: number;
  /** The harness bundle (default: the one built beside this module). */
  bundle?: URL;
  /** The Environment's browser: the harness drives Chromium in the sandbox; screenshots come here. */
  browser?: boolean;
  /** Stores a screenshot the harness sends as a File of the Session. */
  storeFile?: FileStore;
}

export interface ColocatedOutcome {
  stop_reason: IdleStopReason;
  usage: TokenUsage;
  /** What answers each blocking tool use of `requires_action`, by the runner's own policy. */
  awaiting: Map<string, Awaiting>;
}

/** The colocated harness could not run the Run (ends it as a work failure). */
export class ColocatedHarnessError extends Error {
  constructor(
    readonly reason: 'bundle_missing' | 'placement_failed' | 'relay' | 'harness_exited' | 'harness_failed',
    message: string,
    options?: { cause?: unknown },
  ) {
    super(message, options);
    this.name = 'ColocatedHarnessError';
  }
}

interface Bundle {
  data: Buffer;
  digest: string;
  url: URL;
}
const bundles = new Map<string, Promise<Bundle>>();

function loadBundle(url: URL): Promise<Bundle> {
  let b = bundles.get(url.href);
  if (!b) {
    b = readFile(url).then(
      (data) => ({ data, digest: `sha256:${createHash('sha256').update(data).digest('hex')}`, url }),
      (err: unknown) => {
        bundles.delete(url.href);
        throw new ColocatedHarnessError('bundle_missing', `the colocated harness bundle is missing from this runner (${fileURLToPath(url)}): run npm run build`, { cause: err });
      },
    );
    bundles.set(url.href, b);
  }
  return b;
}

/** Puts the bundle where the sandbox can run it; returns the command that starts the harness. */
async function placeHarness(o: ColocatedRunOptions, bundle: Bundle): Promise<string[]> {
  // The process driver shares the host's filesystem: the harness runs straight from the build.
  if (o.sandbox.driver === 'process') return [process.execPath, fileURLToPath(bundle.url)];
  // Written on every Run (the agent can write /tmp): a Run always starts the runner's own code.
  const res = await o.driver.exec(o.sandbox, ['bash', '-c', 'cat > "$1.$$" && mv -f "$1.$$" "$1"', 'agentplane-harness', HARNESS_SANDBOX_PATH], {
    stdin: bundle.data,
    timeoutMs: 30_000,
    maxOutputBytes: 8192,
    signal: o.signal,
  });
  if (res.exitCode !== 0) {
    throw new ColocatedHarnessError('placement_failed', `placing the colocated harness in the sandbox failed (exit ${res.exitCode}): ${res.stderr.trim().slice(0, 500)}`);
  }
  return ['node', HARNESS_SANDBOX_PATH];
}

/** The runner's view of the agent's tools, as the harness gets them (MCP tools without their client). */
function relayTools(agent: AgentConfig): RelayTool[] {
  return agent.tools.map((t): RelayTool =>
    t.type === 'external' ? { type: 'external', spec: t.spec, ...(t.permission ? { permission: t.permission } : {}), ...(t.mcp ? { mcp: t.mcp } : {}) } : t,
  );
}

type Ending =
  | { kind: 'done'; stop: IdleStopReason }
  | { kind: 'error'; message: string }
  | { kind: 'exit'; code: number }
  | { kind: 'relay'; err: RelayError }
  | { kind: 'delivery'; err: unknown }
  | { kind: 'interrupted' }
  | { kind: 'deadline' };

/** Runs one Run with the agent loop inside the sandbox. */
export async function runColocated(o: ColocatedRunOptions): Promise<ColocatedOutcome> {
  const bundle = await loadBundle(o.bundle ?? HARNESS_BUNDLE_URL);
  const argv = await placeHarness(o, bundle);
  o.log.debug({ harness: bundle.digest }, 'starting the colocated harness');
  const proc = await o.driver.spawn(o.sandbox, argv);
  return new Relay(o, proc).run();
}

class Relay {
  private readonly audit: RunAudit;
  private readonly external: Map<string, Extract<AgentConfig['tools'][number], { type: 'external' }>>;
  private readonly streams = new Map<string, AbortController>();
  /** The harness's stderr, its end kept for failure reasons. */
  private readonly stderr = new OutputTail(4096);
  private readonly cancelMs: number;
  private usage: TokenUsage = { ...ZERO_USAGE };
  private lastModelError: ModelError | undefined;
  private chain: Promise<void> = Promise.resolve();
  private pending = 0;
  private logLines = 0;
  private ending: Ending | undefined;
  private settle!: (e: Ending) => void;
  private readonly ended = new Promise<Ending>((resolve) => (this.settle = resolve));
  private readonly timers: NodeJS.Timeout[] = [];

  constructor(
    private readonly o: ColocatedRunOptions,
    private readonly proc: SandboxProcess,
  ) {
    const tools = relayTools(o.run.agent);
    this.audit = new RunAudit(tools, o.run.history, o.run.responses, o.run.agent.max_steps, o.gate !== undefined);
    this.external = new Map(o.run.agent.tools.flatMap((t) => (t.type === 'external' ? [[t.spec.name, t] as const] : [])));
    this.cancelMs = o.cancelTimeoutMs ?? 3_000;
  }

  private end(e: Ending): void {
    if (this.ending) return;
    this.ending = e;
    this.settle(e);
  }

  private send(message: RunnerMessage): void {
    if (this.proc.stdin.writable) this.proc.stdin.write(encodeLine(message));
  }

  async run(): Promise<ColocatedOutcome> {
    const { o, proc } = this;
    const splitter = new LineSplitter(
      (line) => this.enqueue(line),
      (err) => this.end({ kind: 'relay', err }),
    );
    proc.stdout.on('data', (chunk: Buffer) => splitter.push(chunk));
    proc.stdout.on('end', () => {
      splitter.end();
      // Judge the exit only after every line it wrote has been handled.
      void this.chain.then(() => proc.wait()).then(({ exitCode }) => this.end({ kind: 'exit', code: exitCode }));
    });
    proc.stderr.on('data', (chunk: Buffer) => this.stderr.add(chunk));

    const run = o.run;
    this.send({
      type: 'start',
      run: {
        agent: {
          routing_key: run.agent.routing_key,
          ...(run.agent.system !== undefined ? { system: run.agent.system } : {}),
          ...(run.agent.max_steps !== undefined ? { max_steps: run.agent.max_steps } : {}),
          tools: relayTools(run.agent),
        },
        history: run.history,
        ...(run.responses ? { responses: run.responses } : {}),
        ...(run.max_duration_seconds ? { max_duration_seconds: run.max_duration_seconds } : {}),
        ...(o.browser ? { browser: true } : {}),
      },
    });

    const onAbort = (): void => {
      this.audit.stop();
      this.send({ type: 'abort', reason: 'interrupted' });
      this.timers.push(setTimeout(() => this.end({ kind: 'interrupted' }), this.cancelMs));
    };
    if (o.signal.aborted) onAbort();
    else o.signal.addEventListener('abort', onAbort, { once: true });
    if (run.max_duration_seconds) {
      this.timers.push(setTimeout(() => {
        this.audit.stop();
        this.send({ type: 'abort', reason: 'max_duration' });
        this.timers.push(setTimeout(() => this.end({ kind: 'deadline' }), this.cancelMs));
      }, run.max_duration_seconds * 1000 + DEADLINE_GRACE_MS));
    }

    let ending: Ending;
    try {
      ending = await this.ended;
    } finally {
      o.signal.removeEventListener('abort', onAbort);
      for (const t of this.timers) clearTimeout(t);
      for (const s of this.streams.values()) s.abort();
    }
    // A harness cut off because its container was removed from outside the runner failed for the
    // machine's sake: asked before `shutDown`, which takes the sandbox down itself.
    const lost = (ending.kind === 'exit' || ending.kind === 'relay') && !o.signal.aborted && (await o.driver.lost?.(o.sandbox).catch(() => false));
    await this.shutDown(ending);
    if (lost) throw new InfrastructureFailure(`the sandbox went away during the Run: its container was removed while the colocated harness ran`);
    if (o.browser) await this.endBrowser();
    return this.outcome(ending);
  }

  /** Ends the harness: one that finished is let go; any other is killed with everything it started. */
  private async shutDown(ending: Ending): Promise<void> {
    const { o, proc } = this;
    proc.stdin.end();
    if (ending.kind === 'done' || ending.kind === 'error') {
      const exited = await Promise.race([proc.wait().then(() => true), new Promise<false>((r) => setTimeout(() => r(false), this.cancelMs).unref())]);
      if (!exited) await proc.kill().catch(() => undefined);
      return;
    }
    o.log.warn({ session: o.sandbox.sessionId, why: ending.kind }, 'stopping the colocated harness and every process of the sandbox');
    await proc.kill().catch(() => undefined);
    // Tool processes lead their own process groups: stopping the sandbox's processes takes them all.
    await o.driver.suspend(o.sandbox.sessionId).catch(() => undefined);
  }

  /**
   * Chromium leads its own process group (playwright starts it detached): whatever the harness
   * left of it is killed here, so the browser never outlives the Run.
   */
  private async endBrowser(): Promise<void> {
    const script = 'for p in $(ps -eo pid,args | awk \'$2 == "/usr/lib/chromium/chromium" {print $1}\'); do kill -9 "$p" 2>/dev/null; done; exit 0';
    await this.o.driver.exec(this.o.sandbox, ['bash', '-c', script], { timeoutMs: 10_000, maxOutputBytes: 4096 }).catch(() => undefined);
  }

  private outcome(ending: Ending): ColocatedOutcome {
    const awaiting = new Map<string, Awaiting>();
    const result = (stop: IdleStopReason): ColocatedOutcome => {
      if (stop.type === 'requires_action') {
        for (const id of stop.tool_use_ids) {
          const kind = this.audit.awaitingOfUse(id);
          if (kind) awaiting.set(id, kind);
        }
      }
      return { stop_reason: stop, usage: this.usage, awaiting };
    };
    const interrupted = this.o.signal.aborted;
    switch (ending.kind) {
      case 'done':
        return result(interrupted ? { type: 'interrupted' } : ending.stop);
      case 'interrupted':
        return result({ type: 'interrupted' });
      case 'deadline':
        return result({ type: 'max_duration' });
      case 'error':
        if (this.lastModelError) throw new HarnessError('model_error', ending.message, this.lastModelError);
        throw new ColocatedHarnessError('harness_failed', `the colocated harness failed: ${ending.message}`);
      case 'delivery':
        throw ending.err;
      case 'relay':
        if (interrupted) return result({ type: 'interrupted' });
        throw new ColocatedHarnessError('relay', `the colocated harness broke the relay protocol (${ending.err.reason}): ${ending.err.message}`, { cause: ending.err });
      case 'exit': {
        if (interrupted) return result({ type: 'interrupted' });
        const why = ending.code === 127 && /node/.test(this.stderr.text().trim())
          ? 'the sandbox image has no `node` on its PATH (the colocated topology needs Node.js 20 or later in the image)'
          : `the colocated harness exited with code ${ending.code} before it finished the Run`;
        const tail = this.stderr.text().trim();
        throw new ColocatedHarnessError('harness_exited', tail ? `${why}: ${tail.slice(-1000)}` : why);
      }
    }
  }

  /** Lines are handled one at a time, in order; reading pauses while many wait. */
  private enqueue(line: string): void {
    if (this.ending) return;
    this.pending += 1;
    if (this.pending > READ_AHEAD_LINES) this.proc.stdout.pause();
    this.chain = this.chain
      .then(() => (this.ending ? undefined : this.handle(line)))
      .catch((err: unknown) => this.end(err instanceof RelayError ? { kind: 'relay', err } : { kind: 'delivery', err }))
      .finally(() => {
        this.pending -= 1;
        if (this.pending <= READ_AHEAD_LINES / 4) this.proc.stdout.resume();
      });
  }

  private async handle(line: string): Promise<void> {
    const m: HarnessMessage = parseHarnessLine(line);
    switch (m.type) {
      case 'model.request':
        if (this.streams.has(m.id)) throw new RelayError('protocol_violation', `model stream ${m.id} is already open`);
        if (this.streams.size >= MAX_OPEN_STREAMS) throw new RelayError('protocol_violation', `more than ${MAX_OPEN_STREAMS} model streams at once`);
        this.audit.modelRequest();
        this.audit.modelMessages(m.request.messages);
        void this.relayModel(m.id, m.request);
        return;
      case 'model.cancel':
        this.streams.get(m.id)?.abort();
        return;
      case 'tool.check':
        void this.check(m.id, this.audit.checkQuery(m.tool_use_id));
        return;
      case 'tool.call': {
        this.audit.toolCall(m.tool_use_id, m.name);
        const tool = this.external.get(m.name);
        if (!tool) throw new RelayError('protocol_violation', `no MCP tool ${m.name} on this Run`);
        void this.callTool(m.id, m.tool_use_id, tool, m.input);
        return;
      }
      case 'file.store':
        this.audit.fileStore(m.tool_use_id);
        void this.storeFile(m.id, m.tool_use_id, m.filename, Buffer.from(m.data, 'base64'));
        return;
      case 'event':
        this.audit.event(m.event);
        await this.o.sink.emit(m.event);
        return;
      case 'log':
        if (++this.logLines <= MAX_LOG_LINES) this.o.log[m.level]({ session: this.o.sandbox.sessionId, source: 'colocated-harness' }, m.msg);
        return;
      case 'done':
        this.end({ kind: 'done', stop: this.audit.done(m.outcome.stop_reason) });
        return;
      case 'error':
        this.end({ kind: 'error', message: m.message });
        return;
    }
  }

  private async relayModel(id: string, request: ModelRequest): Promise<void> {
    const ac = new AbortController();
    this.streams.set(id, ac);
    const signal = AbortSignal.any([ac.signal, this.o.signal]);
    // The Run's own model route, whatever the harness asked for.
    const req: ModelRequest = { ...request, routing_key: this.o.run.agent.routing_key };
    const size = Buffer.byteLength(JSON.stringify(req));
    try {
      if (size > MAX_MODEL_REQUEST_BYTES) {
        const error: ModelError = { type: 'validation.malformed', message: `the model request (${size} bytes) is larger than one runner frame allows (${MAX_MODEL_REQUEST_BYTES})`, retryable: false };
        this.lastModelError = error;
        this.send({ type: 'model.event', id, event: { type: 'error', error } });
        return;
      }
      for await (const event of this.o.model.stream(req, signal)) {
        this.audit.modelEvent(event, id);
        if (event.type === 'end') this.usage = addUsage(this.usage, event.usage);
        if (event.type === 'error') this.lastModelError = event.error;
        this.send({ type: 'model.event', id, event });
        if (event.type === 'end' || event.type === 'error') break;
      }
    } catch (err) {
      const error: ModelError = { type: 'runtime.internal', message: `model step failed: ${err instanceof Error ? err.message : String(err)}`, retryable: true };
      this.lastModelError = error;
      this.send({ type: 'model.event', id, event: { type: 'error', error } });
    } finally {
      this.streams.delete(id);
      this.audit.modelStreamClosed(id);
      this.send({ type: 'model.end', id });
    }
  }

  /** Asks the control plane about one tool use; a failed check denies (fail closed). */
  private async check(id: string, q: GateQuery): Promise<void> {
    let d: GateDecision;
    if (!this.o.gate) d = { decision: 'allow', rule_id: null, message: 'no ActionPolicies on this runner' };
    else {
      try {
        d = await this.o.gate(q);
      } catch (err) {
        d = { decision: 'deny', rule_id: null, message: `the policy check failed (${err instanceof Error ? err.message : String(err)}); denied (fail closed)` };
      }
    }
    this.audit.decided(q.tool_use_id, d);
    this.send({ type: 'tool.decision', id, decision: d.decision, rule_id: d.rule_id, message: d.message });
  }

  /** A screenshot from the harness: a PNG, stored as a File of the Session (browser Runs only). */
  private async storeFile(id: string, toolUseId: string, filename: string, data: Buffer): Promise<void> {
    let r: { file_id?: string; error?: string };
    if (!this.o.browser || !this.o.storeFile) r = { error: 'this Run has no browser: no File is stored' };
    else if (!pngSize(data)) r = { error: 'file.store: the data is not a PNG' };
    else {
      try {
        const { file_id } = await this.o.storeFile({ filename, content_type: 'image/png', data, tool_use_id: toolUseId });
        this.audit.fileStored(toolUseId, file_id);
        r = { file_id };
      } catch (err) {
        r = { error: err instanceof Error ? err.message : String(err) };
      }
    }
    this.send({ type: 'file.stored', id, ...r });
  }

  private async callTool(id: string, toolUseId: string, tool: Extract<AgentConfig['tools'][number], { type: 'external' }>, input: unknown): Promise<void> {
    let r: { content: string; is_error: boolean };
    try {
      r = await tool.call(input, this.o.signal, toolUseId);
    } catch (err) {
      r = { content: `tool ${tool.spec.name} failed: ${err instanceof Error ? err.message : String(err)}`, is_error: true };
    }
    const content = r.content.length > MAX_TOOL_RESULT_CHARS ? `${r.content.slice(0, MAX_TOOL_RESULT_CHARS)}\n… [truncated ${r.content.length - MAX_TOOL_RESULT_CHARS} characters]` : r.content;
    this.send({ type: 'tool.result', id, content, is_error: r.is_error });
  }
}
