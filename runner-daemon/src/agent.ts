import { WebSocket } from 'ws';
import {
  ATTR, backoffDelay, context, extractTrace, failSpan, injectTrace, nowIso, SpanKind, trace, tracer, tracingEnabled, type Logger, type Span, type TraceCarrier,
} from '@agentplane/core';
import {
  CLOSE, FrameError, RUNNER_DEFAULTS, RUNNER_PROTOCOL_VERSIONS, frame, parseFrame, runnerConnectUrl, saveState, statePath,
  type CredentialRefusal, type GatewayMessage, type GatewayToRunnerType, type LeaseRef, type Payload, type RunnerCapabilities,
  type RunnerCredentialFile, type RunnerStateFile, type RunnerStatus, type RunnerToGatewayType, type ModelClient, type ModelRequest,
  type ModelStreamEvent,
} from '@agentplane/protocol';
import type Docker from 'dockerode';
import { buildCapabilities, hostFacts, memoryAvailableMib, type HostFacts, type SlotPolicy } from './capabilities.js';
import type { DaemonConfig } from './config.js';
import { InfrastructureFailure } from './failures.js';
import type { RunnerMetrics } from './metrics.js';

export const DAEMON_VERSION = '0.1.0';

/**
 * An offer with its spec, as an executor sees it: an offer whose spec followed in `lease.spec`
 * (`lease-spec-v1`) is handed over once the spec is in.
 */
export type LeaseOffer = Payload<'lease.offer'> & { spec: Record<string, unknown> };

/** Specs that reached this daemon before their offer (a frame forwarded between gateway nodes may overtake it). */
const EARLY_SPECS = 256;

/** What an executor gets for one accepted lease. Every write carries the lease's fencing token. */
export interface LeaseHandle {
  readonly lease: LeaseRef;
  readonly offer: LeaseOffer;
  /** Aborted on lease.cancel, lease.revoked, or the drain deadline. */
  readonly signal: AbortSignal;
  sendEvents(sessionId: string, events: Payload<'events.batch'>['events']): void;
  /**
   * Deliver a batch and wait for its events.ack (the assigned sequence numbers), resending
   * across reconnects until acknowledged; producer keys make resends idempotent. Rejects when
   * the lease is revoked (writes are fenced) or after `giveUpMs`.
   */
  deliverEvents(sessionId: string, events: Payload<'events.batch'>['events'], giveUpMs?: number): Promise<number[]>;
  /** Model steps through the control plane's model gateway (model-gateway-v1 frames on this socket). */
  readonly model: ModelClient;
  /**
   * Ask the control plane's ActionPolicies about one tool use before running it (`tool.check`).
   * Resent across reconnects; no answer within `giveUpMs` (or a revoked lease) is a deny.
   */
  checkTool(check: Omit<Payload<'tool.check'>, 'lease_id' | 'attempt'>, giveUpMs?: number): Promise<ToolDecision>;
}

export type ToolDecision = Pick<Payload<'tool.decision'>, 'decision' | 'rule_id' | 'message'>;

/** Runs the work of a lease; resolve = lease.complete, reject = lease.fail. Sandbox drivers plug in here. */
export interface LeaseExecutor {
  /** A reason to reject the offer (e.g. an unknown driver), or null to accept it. */
  refuse(offer: LeaseOffer): string | null;
  run(handle: LeaseHandle): Promise<Record<string, unknown> | undefined>;
  /** Sessions whose sandboxes this executor keeps (reported, so those of ended Sessions are released). */
  sandboxes?(): string[];
  /** The Session was archived or deleted: remove its sandbox and workspace. */
  releaseSandbox?(sessionId: string, reason: string): Promise<void>;
  /**
   * A lease of this Session was lost (revoked, not resumed): stop the processes of the sandbox its
   * work runs in (the Session's, or a child thread's own) now.
   */
  leaseLost?(sessionId: string, lease: LeaseRef): Promise<void>;
}

interface HeldLease {
  ref: LeaseRef;
  sessionId: string;
  abort: AbortController;
  done: Promise<void>;
  /** Set by lease.revoked: the lease is gone and every write would be fenced. */
  revoked: string | null;
  /** The work is done and its end (lease.complete) was sent: the lease is held until the end is answered. */
  ending: boolean;
  /** Settles the wait for the end's answer now (the lease was lost, or the runner stops). */
  settleEnd: ((answer: EndAnswer) => void) | null;
  /** Set when the runner stops waiting for the end's answer. */
  endGivenUp: boolean;
  /**
   * A model step of this lease could not be served because the connection to the control plane
   * was down or went down under it: a failure that follows is the machinery's, not the agent's.
   */
  stepLost: boolean;
}

/** How a sent lease.complete was answered: recorded, refused for good, to be sent again, or not (yet). */
type EndAnswer = 'acked' | 'refused' | 'retry' | 'none';

/**
 * The runner stopping canceled this lease's work (a second signal, the drain deadline, a refused
 * credential): the lease fails as `infrastructure` whatever comes of it, so what the work still
 * sends (the events of its last moments, a policy check) is given one try and no more. Waiting
 * out a reconnect that may never come (the control plane away) would hold the stop for minutes.
 */
const stoppedWork = (h: HeldLease): boolean => h.abort.signal.reason instanceof InfrastructureFailure;

/** Early heartbeats (a slot freed while the control plane counts the runner full) are at least this far apart. */
const EARLY_BEAT_MIN_MS = 250;

/**
 * A lease's end (lease.complete) goes again when unanswered this long; unsent (no live socket),
 * it is tried again this often; after a retryable error, this long after it.
 */
const END_RESEND_MS = 3000;
const END_UNSENT_RETRY_MS = 250;
const END_ERROR_RETRY_MS = 1000;

/** A state file that cannot be written (disk full, read-only) is said at warn level at most this often. */
const STATE_WARN_EVERY_MS = 60_000;

/**
 * The control plane refusing this runner's credential at the upgrade (HTTP 401 or 403) this many
 * times in a row, the second after a short retry, is final: the daemon stops. One refusal alone,
 * or one between other answers (a 503 while the control plane starts, a connection refused), is
 * not.
 */
export const REFUSALS_TO_STOP = 2;

/** Of a refused upgrade's answer, the part read for the control plane's own words. */
const REFUSAL_BODY_BYTES = 4096;
/** How long the rest of a refused upgrade's answer is waited for. */
const REFUSAL_BODY_WAIT_MS = 2000;

/** How one connection ended: welcomed (it served), or the credential refused at the upgrade (401, 403). */
interface ConnectOutcome {
  welcomed: boolean;
  refusal: CredentialRefusal | null;
}

/** The control plane's error type and message in a refused upgrade's body (`{"error": {"type", "message"}}`), if any. */
function errorOfBody(body: string): { type: string | null; message: string | null } {
  try {
    const error = (JSON.parse(body) as { error?: { type?: unknown; message?: unknown } } | null)?.error;
    return {
      type: typeof error?.type === 'string' ? error.type.slice(0, 200) : null,
      message: typeof error?.message === 'string' ? error.message.replace(/\s+/g, ' ').slice(0, 500) : null,
    };
  } catch {
    return { type: null, message: null };
  }
}

/**
 * One runner daemon's connection to the control plane: hello with capabilities, heartbeats,
 * reconnect with capped exponential backoff and jitter, drain on request or SIGTERM.
 */
export class RunnerAgent {
  status: RunnerStatus = 'starting';
  generation: number | null = null;
  private ws: WebSocket | null = null;
  private stopped = false;
  private attempt = 0;
  private msgSeq = 0;
  private heartbeatTimer: NodeJS.Timeout | null = null;
  private heartbeatMs: number;
  /** `available_slots` in the last heartbeat sent, and the offers accepted since (the scheduler's view of this runner). */
  private reportedSlots = 0;
  private acceptedSinceReport = 0;
  private lastEarlyBeatAt = 0;
  private earlyBeat: NodeJS.Timeout | null = null;
  private lastAckAt = 0;
  private lastAckIso: string | null = null;
  private facts: HostFacts | null = null;
  private factsAt = 0;
  private lastCapsJson = '';
  private readonly held = new Map<string, HeldLease>();
  /** Accepted offers whose spec is still to come (`lease.spec`), by `<lease>#<attempt>`. */
  private readonly awaitingSpec = new Map<string, (spec: Payload<'lease.spec'>) => void>();
  /** `lease.spec` frames that came before their offer, by `<lease>#<attempt>` (bounded). */
  private readonly earlySpecs = new Map<string, Payload<'lease.spec'>>();
  private drainDeadline: number | null = null;
  /** Who asked for the drain: the control plane's can be lifted (resume), a local one (signal, CLI) cannot. */
  private drainSource: 'control_plane' | 'local' | null = null;
  private drainTimer: NodeJS.Timeout | null = null;
  private wakeSleep: (() => void) | null = null;
  private finished!: () => void;
  private readonly finishedPromise = new Promise<void>((r) => (this.finished = r));
  executor: LeaseExecutor | null = null;
  /** The Docker tiers the sandbox driver verified (re-probed on every facts refresh). */
  tierSource: (() => Promise<string[]>) | null = null;
  /** The ACP harnesses installed and probed (docs/ACP.md). */
  acpSource: (() => NonNullable<HostFacts['acp']>) | null = null;
  /**
   * Whether the unisolated process driver serves Runs here (the runner started without Docker, or
   * switched away from it and keeps serving what only it can). Null: claimed.
   */
  processSource: (() => boolean) | null = null;
  /** What the browser canary proved (re-probed on every facts refresh; absent: no browser). */
  browserSource: (() => Promise<{ accessibility_tree: boolean; screenshot: boolean }>) | null = null;
  /** Prometheus metrics (set by `start`). */
  metrics: RunnerMetrics | null = null;
  /** Open model streams: stream id → where their frames go, and how the stream ends when the socket goes. */
  private readonly modelStreams = new Map<string, { frame: (event: ModelStreamEvent | null, end: boolean) => void; lost: (reason: string) => void }>();
  private streamSeq = 0;
  /** Event batches waiting for their events.ack, by frame id. */
  private readonly eventAcks = new Map<string, (seqs: number[]) => void>();
  /** Tool checks waiting for their tool.decision, by frame id. */
  private readonly toolDecisions = new Map<string, (d: ToolDecision) => void>();
  /** Leases' ends (lease.complete) waiting for their answer, by frame id. */
  private readonly endAnswers = new Map<string, (answer: EndAnswer) => void>();
  /** The socket is open and the gateway welcomed it: lease frames may go. */
  private live = false;
  private reportTimer: NodeJS.Timeout | null = null;
  /** State file writes that failed since the last one that worked, and when that was last said. */
  private stateWriteFailures = 0;
  private stateWarnedAt = 0;
  /** Set when the control plane refused this runner's credential for good: the daemon stops. */
  private refusal: CredentialRefusal | null = null;

  constructor(
    private readonly cred: RunnerCredentialFile,
    private readonly config: DaemonConfig,
    private readonly log: Logger,
    private readonly docker: Docker,
    private readonly policy: SlotPolicy = { maxSlots: config.maxSlots, slotMemoryMib: config.slotMemoryMib, maxDurationSeconds: 86_400 },
  ) {
    this.heartbeatMs = config.heartbeatIntervalMs ?? RUNNER_DEFAULTS.heartbeatIntervalMs;
  }

  get url(): string {
    return runnerConnectUrl(this.cred.base_url).toString();
  }

  /** Connect and stay connected until stopped or drained. Resolves when the daemon is done. */
  async run(): Promise<void> {
    this.writeState(false);
    void this.loop();
    return this.finishedPromise;
  }

  private async loop(): Promise<void> {
    let refusals = 0;
    while (!this.stopped) {
      const { welcomed, refusal } = await this.connectOnce();
      if (this.stopped) break;
      if (welcomed) this.attempt = 0;
      refusals = refusal ? refusals + 1 : 0;
      if (refusal && refusals >= REFUSALS_TO_STOP) {
        await this.stopRefused(refusal, refusals);
        break;
      }
      // A first refusal is tried again soon, at the base delay: only one that repeats is final.
      const delay = refusal
        ? backoffDelay(0, this.config.reconnectBaseMs, this.config.reconnectCapMs)
        : backoffDelay(this.attempt++, this.config.reconnectBaseMs, this.config.reconnectCapMs);
      this.log.info({ delay_ms: delay, attempt: this.attempt }, 'reconnecting');
      this.writeState(false);
      await new Promise<void>((r) => {
        const t = setTimeout(r, delay);
        this.wakeSleep = () => {
          clearTimeout(t);
          r();
        };
      });
      this.wakeSleep = null;
      if (this.leavesWhenIdle() && this.held.size === 0) break;
    }
    this.finish();
  }

  /**
   * The control plane refused this runner's credential twice in a row (revoked, deleted, its
   * owner or Workspace disabled): no reconnect can help, so the daemon stops, the way a local
   * drain with its deadline reached does. Held work cannot be reported any more (its leases expire
   * and its Runs are retried): it is cancelled at once; the caller then stops the sandboxes.
   */
  private async stopRefused(refusal: CredentialRefusal, refusals: number): Promise<void> {
    this.refusal = refusal;
    this.log.error({
      http_status: refusal.http_status, error_type: refusal.error_type, error_message: refusal.error_message, refusals, held: this.held.size,
    }, 'the control plane refused this runner\'s credential (revoked or deleted?): stopping; pair this machine again (agentplane-runner pair --force; a managed pool\'s runner: enroll --force)');
    const reason = `the control plane refused this runner's credential (HTTP ${refusal.http_status})`;
    // A local drain takes no new work and leaves once idle; what is held is cancelled now.
    this.beginDrain(Date.now() + this.config.drainDeadlineMs, reason);
    this.cancelAll(reason);
    await Promise.allSettled([...this.held.values()].map((h) => h.done));
  }

  /** Why the daemon stopped when the control plane refused its credential for good; null otherwise. */
  get credentialRefusal(): CredentialRefusal | null {
    return this.refusal;
  }

  private finish(): void {
    this.stopped = true;
    this.stopHeartbeat();
    if (this.drainTimer) clearTimeout(this.drainTimer);
    if (this.reportTimer) clearInterval(this.reportTimer);
    this.status = 'draining';
    // A state file that cannot be written (disk full) must not keep the daemon from stopping.
    this.writeState(false);
    this.finished();
  }

  /**
   * Before `run()`: tells `status` and `drain` that this daemon is starting (image check, tier
   * canaries) or, when a stop was asked during its startup, that it stopped. `drain: 'local'`
   * records a stop asked by a signal, so a later `drain` does not signal it again.
   */
  publishStartup(status: 'starting' | 'stopped', drain: 'local' | null = null): void {
    if (drain) this.drainSource = drain;
    const state = this.stateFile(false);
    state.status = status;
    this.writeStateFile(state);
  }

  /** A live, welcomed connection to the control plane. */
  get connected(): boolean {
    return this.live;
  }

  /** The isolation tiers offered now (whose canary ran at the last facts refresh). */
  get verifiedTiers(): string[] {
    return [...(this.facts?.tiers ?? [])];
  }

  /**
   * What this runner can do changed (its sandbox driver switched, Docker came back): the facts
   * are read again and reported now, in a heartbeat when connected, else in the next hello.
   */
  capabilitiesChanged(): void {
    this.factsAt = 0;
    if (this.heartbeatTimer) this.startHeartbeat();
  }

  private async refreshFacts(force = false): Promise<HostFacts> {
    if (!this.facts || force || Date.now() - this.factsAt > 60_000) {
      const before = this.facts;
      const [facts, tiers, browser] = await Promise.all([
        hostFacts(this.docker),
        this.tierSource ? this.tierSource().catch(() => []) : Promise.resolve([]),
        this.browserSource ? this.browserSource().catch(() => undefined) : Promise.resolve(undefined),
      ]);
      this.facts = {
        ...facts, tiers, ...(browser ? { browser } : {}), ...(this.acpSource ? { acp: this.acpSource() } : {}),
        ...(this.processSource ? { processDriver: this.processSource() } : {}),
      };
      this.factsAt = Date.now();
      this.noteIsolationChange(before, this.facts);
    }
    return this.facts;
  }

  /**
   * Says (warn) when the isolation tiers offered change: lost when Docker went away or a canary
   * stopped running (the runner then offers only what is left, perhaps only the unisolated
   * process tier), back when they run again. The metrics follow every refresh.
   */
  private noteIsolationChange(before: HostFacts | null, now: HostFacts): void {
    this.metrics?.dockerUp.set(now.docker ? 1 : 0);
    for (const tier of ['container', 'gvisor']) this.metrics?.tierVerified.set({ tier }, now.tiers.includes(tier) ? 1 : 0);
    if (!before) return;
    const lost = before.tiers.filter((t) => !now.tiers.includes(t));
    const back = now.tiers.filter((t) => !before.tiers.includes(t));
    const docker = now.docker ? 'answering' : 'not answering';
    if (lost.length > 0) {
      this.log.warn({ lost, tiers: now.tiers, docker }, now.tiers.length === 0
        ? 'isolation tiers lost: this runner offers no Docker sandbox now, only the process tier (unisolated)'
        : 'isolation tiers lost: no longer offered until their canary runs again');
    }
    if (back.length > 0) this.log.warn({ regained: back, tiers: now.tiers, docker }, 'isolation tiers offered again: their canary sandbox ran');
  }

  async capabilities(): Promise<RunnerCapabilities> {
    const facts = await this.refreshFacts();
    return buildCapabilities(facts, this.policy, this.held.size);
  }

  /** One connection, from upgrade to close: whether the gateway welcomed us, or refused the credential. */
  private async connectOnce(): Promise<ConnectOutcome> {
    let caps: RunnerCapabilities;
    try {
      caps = await this.capabilities();
    } catch (err) {
      this.log.warn({ err }, 'capability detection failed');
      return { welcomed: false, refusal: null };
    }
    // A local drain finished while the capabilities were read: there is nothing to connect for.
    if (this.stopped) return { welcomed: false, refusal: null };
    return new Promise<ConnectOutcome>((resolve) => {
      let welcomed = false;
      let refusal: CredentialRefusal | null = null;
      const ws = new WebSocket(this.url, {
        headers: { authorization: `Bearer ${this.cred.secret}` },
        maxPayload: RUNNER_DEFAULTS.maxFrameBytes,
        handshakeTimeout: 10_000,
        perMessageDeflate: false,
      });
      this.ws = ws;
      ws.on('unexpected-response', (_req, res) => {
        const status = res.statusCode ?? 0;
        if (status !== 401 && status !== 403) {
          this.log.warn({ status }, 'runner upgrade refused');
          res.resume();
          ws.terminate();
          return;
        }
        // The control plane's own words (revoked, a disabled Workspace) are in the answer's body.
        let body = '';
        let read = false;
        const done = (): void => {
          if (read) return;
          read = true;
          clearTimeout(timer);
          const error = errorOfBody(body);
          refusal = { http_status: status, error_type: error.type, error_message: error.message, at: nowIso() };
          this.log.warn({ status, error_type: error.type, error_message: error.message }, 'runner upgrade refused: the control plane refused this runner\'s credential');
          ws.terminate();
        };
        const timer = setTimeout(done, REFUSAL_BODY_WAIT_MS);
        res.setEncoding('utf8');
        res.on('data', (chunk: string) => {
          if (body.length < REFUSAL_BODY_BYTES) body += chunk.slice(0, REFUSAL_BODY_BYTES - body.length);
        });
        res.on('end', done);
        res.on('error', done);
        res.on('close', done);
      });
      ws.on('open', () => {
        this.lastCaps(caps);
        this.reportedSlots = caps.available_slots;
        this.acceptedSinceReport = 0;
        this.send('hello', {
          protocol_versions: [...RUNNER_PROTOCOL_VERSIONS],
          daemon_version: DAEMON_VERSION,
          status: this.status,
          capabilities: caps,
          held_leases: this.heldRefs(),
        });
      });
      ws.on('message', (data, isBinary) => {
        if (isBinary) return ws.close(CLOSE.MALFORMED, 'binary frames are not accepted');
        let msg: GatewayMessage;
        try {
          msg = parseFrame(data.toString(), 'gateway');
        } catch (err) {
          this.log.error({ err: err instanceof FrameError ? err.message : String(err) }, 'malformed frame from the gateway');
          return ws.close(CLOSE.MALFORMED, 'malformed frame');
        }
        if (msg.type === 'welcome') welcomed = true;
        this.onMessage(msg).catch((err: unknown) => this.log.error({ err, type: msg.type }, 'frame handling failed'));
      });
      ws.on('error', (err) => this.log.warn({ err: err.message }, 'runner socket error'));
      ws.on('close', (code, reason) => {
        this.live = false;
        this.resendEnds();
        // The control plane ends the model streams of a closed socket: none of their frames comes
        // on the next connection, so a step still streaming ends now instead of at the Run's end.
        for (const s of [...this.modelStreams.values()]) s.lost('the connection to the control plane was lost during the model step');
        this.stopHeartbeat();
        this.metrics?.connected.set(0);
        if (this.ws === ws) this.ws = null;
        this.generation = welcomed ? this.generation : null;
        // Expected while this runner drains (a Ctrl-C stops the control plane at the same time).
        const level = code === CLOSE.NORMAL || code === CLOSE.DRAINED || this.drainDeadline !== null ? 'info' : 'warn';
        this.log[level]({ close_code: code, reason: reason.toString() }, 'disconnected from the control plane');
        if (code === CLOSE.SUPERSEDED) this.attempt = Math.max(this.attempt, 3);
        resolve({ welcomed, refusal });
      });
    });
  }

  private lastCaps(caps: RunnerCapabilities): void {
    const { available_slots: _slots, ...rest } = caps;
    void _slots;
    this.lastCapsJson = JSON.stringify(rest);
  }

  private send<T extends RunnerToGatewayType>(type: T, payload: Payload<T>, re?: string): boolean {
    return this.sendWithId(type, `r${(++this.msgSeq).toString(36)}`, payload, re);
  }

  /**
   * A frame sent once (a lease's failure): on a socket that is open but not welcomed yet (its
   * hello sent), it waits for the welcome (up to `waitMs`) instead of being dropped; with no
   * socket at all it is not sent, as before (the lease is then ended by its expiry).
   */
  private async sendWhenLive<T extends RunnerToGatewayType>(type: T, payload: Payload<T>, waitMs = 10_000): Promise<void> {
    const deadline = Date.now() + waitMs;
    const opening = (): boolean => !this.live && this.ws !== null && this.ws.readyState === this.ws.OPEN;
    while (opening() && Date.now() < deadline) await new Promise((r) => setTimeout(r, 50));
    this.send(type, payload);
  }

  private sendWithId<T extends RunnerToGatewayType>(type: T, id: string, payload: Payload<T>, re?: string): boolean {
    const ws = this.ws;
    if (!ws || ws.readyState !== ws.OPEN) return false;
    // Nothing but the hello goes out before the welcome: the gateway closes a connection whose
    // frame comes first (4422), and a retry of work held across a reconnect (events, a policy
    // check) would otherwise race the hello's answer. Not sent: the caller tries again.
    if (!this.live && type !== 'hello') return false;
    // Inside a span (a lease, a model call, a tool), the frame carries its W3C context.
    ws.send(frame(type, id, payload, re, injectTrace()));
    return true;
  }

  private async deliverEvents(key: string, ref: LeaseRef, sessionId: string, events: Payload<'events.batch'>['events'], giveUpMs: number): Promise<number[]> {
    const deadline = Date.now() + giveUpMs;
    let tried = false;
    for (;;) {
      const held = this.held.get(key);
      if (held?.revoked) throw new Error(`lease revoked: ${held.revoked}`);
      if (Date.now() > deadline) throw new Error('events were not acknowledged in time');
      if (tried && held && stoppedWork(held)) throw new Error('the runner stopped before these events were acknowledged');
      tried = true;
      const id = `r${(++this.msgSeq).toString(36)}`;
      const acked = new Promise<number[]>((resolve) => this.eventAcks.set(id, resolve));
      const sent = this.sendWithId('events.batch', id, { ...ref, session_id: sessionId, events });
      let timer: NodeJS.Timeout | undefined;
      const seqs = await Promise.race([acked, new Promise<null>((r) => (timer = setTimeout(() => r(null), sent ? 3000 : 250)))]);
      clearTimeout(timer);
      this.eventAcks.delete(id);
      if (seqs) return seqs;
    }
  }

  private async checkTool(key: string, ref: LeaseRef, check: Omit<Payload<'tool.check'>, 'lease_id' | 'attempt'>, giveUpMs: number): Promise<ToolDecision> {
    const deadline = Date.now() + giveUpMs;
    let tried = false;
    for (;;) {
      const held = this.held.get(key);
      if (held?.revoked) return { decision: 'deny', rule_id: null, message: `not run: the lease was revoked (${held.revoked})` };
      if (Date.now() > deadline) return { decision: 'deny', rule_id: null, message: 'not run: the control plane did not answer the policy check in time (fail closed)' };
      if (tried && held && stoppedWork(held)) return { decision: 'deny', rule_id: null, message: 'not run: the runner stopped (fail closed)' };
      tried = true;
      const id = `t${(++this.msgSeq).toString(36)}`;
      const answered = new Promise<ToolDecision>((resolve) => this.toolDecisions.set(id, resolve));
      const sent = this.sendWithId('tool.check', id, { ...ref, ...check });
      let timer: NodeJS.Timeout | undefined;
      const d = await Promise.race([answered, new Promise<null>((r) => (timer = setTimeout(() => r(null), sent ? 5000 : 250)))]);
      clearTimeout(timer);
      this.toolDecisions.delete(id);
      if (d) return d;
    }
  }

  private heldRefs(): LeaseRef[] {
    return [...this.held.values()].map((h) => h.ref);
  }

  private async onMessage(msg: GatewayMessage): Promise<void> {
    switch (msg.type) {
      case 'welcome': {
        const p = msg.payload;
        this.generation = p.generation;
        this.live = true;
        this.resendEnds();
        this.heartbeatMs = this.config.heartbeatIntervalMs ?? p.heartbeat_interval_ms;
        if (this.status === 'starting') this.status = 'ready';
        this.lastAckAt = Date.now();
        this.metrics?.connected.set(1);
        this.log.info({ generation: p.generation, protocol: p.protocol_version }, 'connected to the control plane');
        const resumed = new Set(p.resumed_leases.map((l) => `${l.lease_id}#${l.attempt}`));
        for (const [k, h] of this.held) if (!resumed.has(k)) this.loseLease(h, 'lease not resumed after reconnect');
        if (p.drain) this.beginDrain(Date.parse(p.drain.deadline), p.drain.reason, 'control_plane');
        // A resume sent while this runner was away: the welcome no longer carries the drain.
        else if (this.drainSource === 'control_plane') this.resume('drain lifted while disconnected');
        this.startHeartbeat();
        this.startSandboxReports();
        this.writeState(true);
        // A local drain that finished while this connection was being made (a signal during the
        // upgrade) found no open socket to say `drained` on: it is said now, and the daemon leaves
        // instead of staying connected until the drain deadline.
        if (this.stopped) this.maybeFinishDrain();
        return;
      }
      case 'heartbeat.ack': {
        this.lastAckAt = Date.now();
        this.lastAckIso = nowIso();
        for (const c of msg.payload.cancellations) this.held.get(`${c.lease_id}#${c.attempt}`)?.abort.abort(new Error(c.reason));
        this.writeState(true);
        return;
      }
      case 'drain':
        this.beginDrain(Date.parse(msg.payload.deadline), msg.payload.reason, 'control_plane');
        return;
      case 'resume':
        this.resume(msg.payload.reason);
        return;
      case 'lease.offer':
        return this.onOffer(msg.payload, { ...(msg.traceparent ? { traceparent: msg.traceparent } : {}), ...(msg.tracestate ? { tracestate: msg.tracestate } : {}) });
      case 'lease.spec': {
        const key = `${msg.payload.lease_id}#${msg.payload.attempt}`;
        const waiting = this.awaitingSpec.get(key);
        if (waiting) return waiting(msg.payload);
        if (this.held.has(key)) return;
        this.earlySpecs.set(key, msg.payload);
        if (this.earlySpecs.size > EARLY_SPECS) this.earlySpecs.delete(this.earlySpecs.keys().next().value as string);
        return;
      }
      case 'lease.revoked': {
        const h = this.held.get(`${msg.payload.lease_id}#${msg.payload.attempt}`);
        if (h) {
          h.revoked = msg.payload.reason;
          this.loseLease(h, msg.payload.reason);
        }
        return;
      }
      case 'sandboxes.release':
        for (const s of msg.payload.sessions) {
          await this.executor?.releaseSandbox?.(s.session_id, s.reason).catch((err: unknown) =>
            this.log.warn({ session: s.session_id, err: err instanceof Error ? err.message : String(err) }, 'sandbox release failed'));
        }
        return;
      case 'lease.cancel':
        this.held.get(`${msg.payload.lease_id}#${msg.payload.attempt}`)?.abort.abort(new Error(msg.payload.reason));
        return;
      case 'events.ack':
        if (msg.re) this.eventAcks.get(msg.re)?.(msg.payload.seqs);
        return;
      case 'tool.decision':
        if (msg.re) this.toolDecisions.get(msg.re)?.({ decision: msg.payload.decision, rule_id: msg.payload.rule_id, message: msg.payload.message });
        return;
      case 'model.delta':
      case 'model.end':
        this.modelStreams.get(msg.payload.stream_id)?.frame(msg.payload.event as ModelStreamEvent, msg.type === 'model.end');
        return;
      case 'ack':
        if (msg.re) this.endAnswers.get(msg.re)?.('acked');
        return;
      case 'error':
        this.log.warn({ error_code: msg.payload.code, message: msg.payload.message, re: msg.re }, 'gateway reported an error');
        if (msg.re) this.endAnswers.get(msg.re)?.(msg.payload.retryable ? 'retry' : 'refused');
        return;
      default:
        this.log.debug({ type: (msg as { type: GatewayToRunnerType }).type }, 'frame not used by this daemon yet');
    }
  }

  /** The lease is gone: stop the work now and let the executor kill what still runs for it. */
  private loseLease(h: HeldLease, reason: string): void {
    // Done already, it only waited for its end's answer: nothing of it runs (the Session's sandbox
    // may serve its next turn by now), so nothing is stopped.
    if (h.ending) return this.giveUpEnd(h);
    h.abort.abort(new Error(reason));
    this.executor?.leaseLost?.(h.sessionId, h.ref).catch((err: unknown) =>
      this.log.warn({ session: h.sessionId, err: err instanceof Error ? err.message : String(err) }, 'stopping the sandbox of a lost lease failed'));
  }

  /** Reports the kept sandboxes now and then, so those of archived or deleted Sessions are released. */
  private startSandboxReports(): void {
    if (this.reportTimer) clearInterval(this.reportTimer);
    const report = () => {
      const ids = this.executor?.sandboxes?.() ?? [];
      for (let i = 0; i < ids.length; i += 1024) this.send('sandboxes.report', { session_ids: ids.slice(i, i + 1024) });
    };
    report();
    this.reportTimer = setInterval(report, this.config.sandboxReportMs);
    this.reportTimer.unref();
  }

  /** A ModelClient whose steps travel as model.request frames fenced by this lease. */
  private modelClientFor(ref: LeaseRef, key: string): ModelClient {
    const agent = this;
    const client = {
      async *stream(request: ModelRequest, signal: AbortSignal): AsyncIterable<ModelStreamEvent> {
        // One CLIENT span per model step (GenAI conventions): the model.request frame carries it, so
        // the gateway's provider call is its child. Names and token counts only, never the messages.
        const span = tracingEnabled()
          ? tracer().startSpan(`chat ${request.routing_key}`, {
            kind: SpanKind.CLIENT,
            attributes: { [ATTR.genAiOperationName]: 'chat', [ATTR.genAiRequestModel]: request.routing_key, 'agentplane.model.tools': request.tools.length },
          }, context.active())
          : undefined;
        const inSpan = <T>(fn: () => T): T => (span ? context.with(trace.setSpan(context.active(), span), fn) : fn());
        try {
          for await (const ev of inSpan(() => client.steps(request, signal, inSpan))) {
            if (ev.type === 'end') {
              span?.setAttributes({
                [ATTR.genAiProviderName]: ev.provider, [ATTR.genAiResponseModel]: ev.model, [ATTR.genAiUsageInputTokens]: ev.usage.input_tokens,
                [ATTR.genAiUsageOutputTokens]: ev.usage.output_tokens, [ATTR.genAiResponseFinishReasons]: [ev.stop_reason],
              });
            } else if (ev.type === 'error' && span) {
              failSpan(span, Object.assign(new Error('model error'), { type: ev.error.type }));
            }
            yield ev;
          }
        } finally {
          span?.end();
        }
      },
      async *steps(request: ModelRequest, signal: AbortSignal, inSpan: <T>(fn: () => T) => T): AsyncIterable<ModelStreamEvent> {
        const streamId = `m${(++agent.streamSeq).toString(36)}`;
        const queue: ModelStreamEvent[] = [];
        let ended = false;
        let wake: (() => void) | null = null;
        // Without the control plane the step cannot be served: the Run is retried rather than failed.
        const markLost = (): void => {
          const held = agent.held.get(key);
          if (held) held.stepLost = true;
        };
        agent.modelStreams.set(streamId, {
          frame: (event, end) => {
            if (event) queue.push(event);
            if (end) ended = true;
            wake?.();
          },
          lost: (reason) => {
            if (ended) return;
            markLost();
            queue.push({ type: 'error', error: { type: 'runtime.internal', message: reason, retryable: true } });
            ended = true;
            wake?.();
          },
        });
        const onAbort = () => {
          agent.send('model.cancel', { stream_id: streamId });
          queue.push({ type: 'error', error: { type: 'runtime.internal', message: 'the model step was canceled', retryable: false } });
          ended = true;
          wake?.();
        };
        signal.addEventListener('abort', onAbort, { once: true });
        try {
          if (!inSpan(() => agent.send('model.request', { ...ref, stream_id: streamId, request }))) {
            markLost();
            yield { type: 'error', error: { type: 'runtime.internal', message: 'not connected to the control plane', retryable: true } };
            return;
          }
          // A step served again (a harness that retries its model calls) outlives one that was lost.
          const held = agent.held.get(key);
          if (held) held.stepLost = false;
          for (;;) {
            while (queue.length > 0) {
              const ev = queue.shift() as ModelStreamEvent;
              yield ev;
              if (ev.type === 'end' || ev.type === 'error') return;
            }
            if (ended) return;
            await new Promise<void>((r) => (wake = r));
            wake = null;
          }
        } finally {
          signal.removeEventListener('abort', onAbort);
          agent.modelStreams.delete(streamId);
        }
      },
    };
    return { stream: (request, signal) => client.stream(request, signal) };
  }

  /**
   * With tracing on, the accepted lease is one CONSUMER span continuing the scheduler's offer
   * span; everything the executor does for it (frames, model calls, tools) runs inside it.
   */
  private onOffer(offer: Payload<'lease.offer'>, carrier: TraceCarrier): void {
    if (!tracingEnabled()) return this.handleOffer(offer, undefined);
    const span = tracer().startSpan('process lease.offer', {
      kind: SpanKind.CONSUMER,
      attributes: {
        [ATTR.messagingSystem]: 'agentplane.runner', [ATTR.messagingOperationType]: 'process', [ATTR.messagingOperationName]: 'process',
        [ATTR.messagingDestinationName]: 'lease.offer', [ATTR.messagingMessageId]: offer.lease_id,
        'agentplane.run.id': offer.run_id, 'agentplane.session.id': offer.session_id, 'agentplane.lease.attempt': offer.attempt,
      },
    }, extractTrace(carrier));
    context.with(trace.setSpan(context.active(), span), () => this.handleOffer(offer, span));
  }

  private handleOffer(offer: Payload<'lease.offer'>, span: Span | undefined): void {
    const ref = { lease_id: offer.lease_id, attempt: offer.attempt };
    const key = `${ref.lease_id}#${ref.attempt}`;
    if (this.held.has(key)) {
      // The same offer delivered twice: the lease is already taken and running here.
      span?.setAttribute('agentplane.lease.outcome', 'duplicate');
      span?.end();
      return;
    }
    const reject = (reason: string) => {
      this.earlySpecs.delete(key);
      this.metrics?.leases.inc({ outcome: 'rejected' });
      span?.setAttribute('agentplane.lease.outcome', 'rejected');
      span?.end();
      this.send('lease.reject', { ...ref, reason });
    };
    if (this.status === 'draining') return reject('runner is draining');
    const executor = this.executor;
    if (!executor) return reject('no executor is installed on this runner');
    // An offer whose spec follows is judged on it once it is in (a refusal then fails the lease).
    const refusal = offer.spec ? executor.refuse(offer as LeaseOffer) : null;
    if (refusal) return reject(refusal);
    if (this.facts && buildCapabilities(this.facts, this.policy, this.held.size).available_slots <= 0) return reject('no free slot');
    const abort = new AbortController();
    this.send('lease.accept', ref);
    this.acceptedSinceReport++;
    const renew = setInterval(() => this.send('lease.heartbeat', ref), Math.max(500, Math.floor(offer.lease_ttl_ms / 3)));
    const handleFor = (full: LeaseOffer): LeaseHandle => ({
      lease: ref, offer: full, signal: abort.signal,
      sendEvents: (sessionId, events) => void this.send('events.batch', { ...ref, session_id: sessionId, events }),
      model: this.modelClientFor(ref, key),
      deliverEvents: (sessionId, events, giveUpMs = 120_000) => this.deliverEvents(key, ref, sessionId, events, giveUpMs),
      checkTool: (check, giveUpMs = 60_000) => this.checkTool(key, ref, check, giveUpMs),
    });
    const full: Promise<LeaseOffer | null> = offer.spec ? Promise.resolve(offer as LeaseOffer) : this.specFor(key, offer, abort.signal).then((spec) => {
      if (spec === null) return null;
      const withSpec = { ...offer, spec };
      const refused = executor.refuse(withSpec);
      if (refused) throw new InfrastructureFailure(`this runner cannot run the offered spec: ${refused}`);
      return withSpec;
    });
    const endTimer = this.metrics?.leaseSeconds.startTimer();
    // Cancelled (user.interrupt) before its spec came: the turn ends interrupted, nothing ran.
    const done = full.then((o) => (o === null ? { stop_reason: { type: 'interrupted' } } : executor.run(handleFor(o)))).then((result) => {
      // The executor ends aborted work as interrupted; aborted because this runner stops, the
      // lease fails instead, so the Run is retried rather than ended.
      if (abort.signal.reason instanceof InfrastructureFailure) throw abort.signal.reason;
      return result;
    }).then(
      (result) => {
        this.metrics?.leases.inc({ outcome: 'completed' });
        span?.setAttribute('agentplane.lease.outcome', 'completed');
        return this.sendEnd(key, { ...ref, ...(result ? { result } : {}) });
      },
      (err: unknown) => {
        const failureClass: 'infrastructure' | 'work' = abort.signal.aborted || err instanceof InfrastructureFailure || this.held.get(key)?.stepLost
          ? 'infrastructure' : 'work';
        this.metrics?.leases.inc({ outcome: failureClass === 'work' ? 'failed_work' : 'failed_infrastructure' });
        if (span) {
          failSpan(span, err);
          span.setAttribute('agentplane.lease.outcome', `failed_${failureClass}`);
        }
        return this.sendWhenLive('lease.fail', { ...ref, failure_class: failureClass, reason: String(err instanceof Error ? err.message : err).slice(0, 2000) || 'failed' });
      },
    ).finally(() => {
      endTimer?.();
      span?.end();
      clearInterval(renew);
      this.held.delete(key);
      this.slotFreed();
      this.maybeFinishDrain();
    });
    this.held.set(key, { ref, sessionId: offer.session_id, abort, done, revoked: null, ending: false, settleEnd: null, endGivenUp: false, stepLost: false });
  }

  /**
   * Sends the lease's end (`lease.complete`) until the gateway answers it: `ack` (recorded),
   * `lease.revoked` (the lease is gone: nothing to record), or an error no retry can help. Until
   * then the lease stays held, listed in `held_leases` (a reconnect resumes it, instead of the
   * gateway failing it as `runner_restarted`) and renewed, and the frame goes again after a
   * reconnect, a retryable error, or no answer in time: a result lost with a dead socket, or with
   * the control plane process that read it, is not lost with the lease. The gateway answers a
   * repeat as it answered the first. The runner stopping (`cancelAll`) ends the wait.
   */
  private async sendEnd(key: string, payload: Payload<'lease.complete'>): Promise<void> {
    for (;;) {
      const held = this.held.get(key);
      if (!held || held.revoked !== null || held.endGivenUp) return;
      held.ending = true;
      const id = `r${(++this.msgSeq).toString(36)}`;
      const answered = new Promise<EndAnswer>((resolve) => {
        this.endAnswers.set(id, resolve);
        held.settleEnd = resolve;
      });
      const sent = this.live && this.sendWithId('lease.complete', id, payload);
      let timer: NodeJS.Timeout | undefined;
      const answer = await Promise.race([answered, new Promise<EndAnswer>((r) => (timer = setTimeout(() => r('none'), sent ? END_RESEND_MS : END_UNSENT_RETRY_MS)))]);
      clearTimeout(timer);
      this.endAnswers.delete(id);
      held.settleEnd = null;
      if (answer === 'acked' || answer === 'refused') return;
      if (answer === 'retry') await new Promise((r) => setTimeout(r, END_ERROR_RETRY_MS));
    }
  }

  /**
   * Ends waiting for their answer go again now: their socket closed (no answer comes on it), or a
   * new one was welcomed (they go on it).
   */
  private resendEnds(): void {
    for (const h of this.held.values()) h.settleEnd?.('none');
  }

  /** Stops waiting for the answer to a lease's end: the lease was lost, or the runner stops. */
  private giveUpEnd(h: HeldLease): void {
    h.endGivenUp = true;
    h.settleEnd?.('refused');
  }

  /**
   * The spec of an accepted offer that came without one: from its `lease.spec` frame (already
   * here, or awaited). Null when the lease is cancelled first (`lease.cancel`). An infrastructure
   * failure (the Run is retried) when the frame says the spec could not be built, when the lease
   * is revoked or the drain deadline passes first, or when none comes in time (the scheduler that
   * made the offer died).
   */
  private specFor(key: string, offer: Payload<'lease.offer'>, signal: AbortSignal): Promise<Record<string, unknown> | null> {
    const waitMs = Math.max(10_000, offer.accept_within_ms * 2);
    return new Promise((resolve, reject) => {
      const settle = (p: Payload<'lease.spec'>) => {
        cleanup();
        if (p.spec) resolve(p.spec);
        else reject(new InfrastructureFailure(`the control plane could not prepare this lease: ${p.error ?? 'no spec'}`));
      };
      const onAbort = () => {
        cleanup();
        if (!this.held.get(key)?.revoked && this.status !== 'draining') return resolve(null);
        const reason: unknown = signal.reason;
        reject(new InfrastructureFailure(`the lease ended before its spec arrived: ${reason instanceof Error ? reason.message : String(reason)}`));
      };
      const timer = setTimeout(() => {
        cleanup();
        reject(new InfrastructureFailure(`no spec arrived within ${waitMs} ms of the offer`));
      }, waitMs);
      const cleanup = () => {
        clearTimeout(timer);
        signal.removeEventListener('abort', onAbort);
        this.awaitingSpec.delete(key);
      };
      const early = this.earlySpecs.get(key);
      if (early) {
        this.earlySpecs.delete(key);
        settle(early);
        return;
      }
      if (signal.aborted) return onAbort();
      signal.addEventListener('abort', onAbort, { once: true });
      this.awaitingSpec.set(key, settle);
    });
  }

  private startHeartbeat(): void {
    this.stopHeartbeat();
    const beat = async () => {
      // A silent gateway (no ack for 3 intervals) is a dead connection: cut it and reconnect.
      if (Date.now() - this.lastAckAt > this.heartbeatMs * 3 + 1000) {
        this.log.warn('no heartbeat acknowledgement; reconnecting');
        this.ws?.terminate();
        return;
      }
      let caps: RunnerCapabilities | undefined;
      try {
        const facts = await this.refreshFacts();
        facts.memAvailableMib = await memoryAvailableMib();
        caps = buildCapabilities(facts, this.policy, this.held.size);
      } catch (err) {
        this.log.debug({ err }, 'capability refresh failed');
      }
      const { available_slots: _s, ...rest } = caps ?? { available_slots: 0 };
      void _s;
      const changed = caps !== undefined && JSON.stringify(rest) !== this.lastCapsJson;
      if (changed && caps) this.lastCaps(caps);
      this.reportedSlots = this.status === 'draining' ? 0 : (caps?.available_slots ?? 0);
      this.acceptedSinceReport = 0;
      this.send('heartbeat', {
        status: this.status,
        available_slots: this.reportedSlots,
        held_leases: this.heldRefs(),
        ...(changed && caps ? { capabilities: caps } : {}),
      });
    };
    void beat();
    this.heartbeatTimer = setInterval(() => void beat(), this.heartbeatMs);
  }

  private stopHeartbeat(): void {
    if (this.heartbeatTimer) clearInterval(this.heartbeatTimer);
    this.heartbeatTimer = null;
    if (this.earlyBeat) clearTimeout(this.earlyBeat);
    this.earlyBeat = null;
  }

  /**
   * A lease ended. When the control plane counts this runner full (the slots of its last
   * heartbeat all taken by offers accepted since), the free slot is reported at once, not at the
   * next heartbeat: a busy pool's runner would otherwise sit idle for up to a heartbeat interval
   * after each turn. At most one such early heartbeat every EARLY_BEAT_MIN_MS.
   */
  private slotFreed(): void {
    if (!this.heartbeatTimer || this.status !== 'ready' || this.stopped) return;
    if (this.reportedSlots - this.acceptedSinceReport > 0 || this.earlyBeat) return;
    const wait = this.lastEarlyBeatAt + EARLY_BEAT_MIN_MS - Date.now();
    const go = () => {
      this.earlyBeat = null;
      if (!this.heartbeatTimer || this.status !== 'ready' || this.stopped) return;
      this.lastEarlyBeatAt = Date.now();
      this.startHeartbeat();
    };
    if (wait <= 0) return go();
    this.earlyBeat = setTimeout(go, wait);
    this.earlyBeat.unref();
  }

  /**
   * Stop taking work; finish held leases until the deadline, then cancel them. A local drain
   * (signal, `drain` command) then says drained and leaves; a control-plane drain leaves too with
   * `exitWhenDrained`, and otherwise stays connected and idle until the control plane resumes it.
   */
  beginDrain(deadline: number, reason: string, source: 'control_plane' | 'local' = 'local'): void {
    const first = this.drainDeadline === null;
    this.drainDeadline = first ? deadline : Math.min(this.drainDeadline!, deadline);
    if (this.drainSource !== 'local') this.drainSource = source;
    this.status = 'draining';
    if (first) this.log.info({ deadline: new Date(deadline).toISOString(), reason, held: this.held.size }, 'draining');
    this.writeState(this.ws !== null);
    if (this.heartbeatTimer) this.startHeartbeat(); // tell the gateway now
    const wait = Math.max(0, this.drainDeadline - Date.now());
    if (this.drainTimer) clearTimeout(this.drainTimer);
    this.drainTimer = setTimeout(() => {
      if (this.held.size > 0) this.log.warn({ held: this.held.size }, 'drain deadline reached: canceling held work');
      this.cancelAll('drain deadline reached');
    }, wait);
    this.drainTimer.unref();
    this.maybeFinishDrain();
  }

  /** The control plane lifted its drain: take work again (a local drain is not undone). */
  resume(reason: string): void {
    if (this.drainSource !== 'control_plane' || this.stopped) return;
    this.drainDeadline = null;
    this.drainSource = null;
    if (this.drainTimer) clearTimeout(this.drainTimer);
    this.drainTimer = null;
    this.status = 'ready';
    this.log.info({ reason }, 'resumed: taking work again');
    this.writeState(this.ws !== null);
    if (this.heartbeatTimer) this.startHeartbeat(); // tell the gateway now
  }

  private leavesWhenIdle(): boolean {
    return this.drainDeadline !== null && (this.drainSource === 'local' || this.config.exitWhenDrained);
  }

  /** Leases held now. */
  get heldCount(): number {
    return this.held.size;
  }

  /** Second SIGTERM: cancel held work now. */
  cancelAll(reason: string): void {
    // The runner stops, not the user: the Runs it cancels are infrastructure failures, retried
    // (possibly elsewhere), never turns ended `interrupted` (docs/RUNS.md).
    for (const h of this.held.values()) {
      h.abort.abort(new InfrastructureFailure(`the runner stopped: ${reason}`));
      if (h.ending) this.giveUpEnd(h);
    }
    this.maybeFinishDrain();
  }

  private maybeFinishDrain(): void {
    if (this.drainDeadline === null || this.held.size > 0) return;
    if (!this.leavesWhenIdle()) {
      this.log.info('drained: idle until the control plane resumes this runner');
      return;
    }
    const ws = this.ws;
    this.stopped = true;
    this.wakeSleep?.();
    if (ws && ws.readyState === ws.OPEN) {
      this.send('drained', { held_leases: [] });
      const t = setTimeout(() => ws.terminate(), 2_000);
      ws.once('close', () => clearTimeout(t));
      ws.close(CLOSE.DRAINED, 'drained');
    } else if (!ws) {
      this.wakeSleep?.();
    }
  }

  private stateFile(connected: boolean): RunnerStateFile {
    return {
      pid: process.pid,
      status: connected ? this.status : this.stopped ? 'stopped' : 'disconnected',
      connected,
      generation: this.generation,
      base_url: this.cred.base_url,
      runner_id: this.cred.runner_id,
      last_heartbeat_ack_at: this.lastAckIso,
      reconnect_attempt: this.attempt,
      drain: this.drainSource,
      credential_refused: this.refusal,
      updated_at: nowIso(),
    };
  }

  private writeState(connected: boolean): void {
    this.writeStateFile(this.stateFile(connected));
  }

  /**
   * Never throws: a state file that cannot be written (disk full, read-only) leaves `status` and
   * `drain` with a stale view, said at warn level at most once a minute, and again once it works.
   */
  private writeStateFile(state: RunnerStateFile): void {
    try {
      saveState(this.config.configDir, state);
      if (this.stateWriteFailures > 0) {
        this.log.info({ failed_writes: this.stateWriteFailures }, 'state file written again');
        this.stateWriteFailures = 0;
        this.stateWarnedAt = 0;
      }
    } catch (err) {
      this.stateWriteFailures += 1;
      const now = Date.now();
      if (now - this.stateWarnedAt < STATE_WARN_EVERY_MS) return;
      this.stateWarnedAt = now;
      this.log.warn({
        err: err instanceof Error ? err.message : String(err), code: (err as NodeJS.ErrnoException).code ?? null, path: statePath(this.config.configDir),
        failed_writes: this.stateWriteFailures,
      }, 'state file could not be written (disk full or read-only?): `agentplane-runner status` and `drain` see a stale state until it can');
    }
  }
}
