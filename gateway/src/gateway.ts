import { randomBytes } from 'node:crypto';
import { STATUS_CODES, type IncomingMessage, type Server } from 'node:http';
import type { Duplex } from 'node:stream';
import { WebSocketServer, type WebSocket } from 'ws';
import { ApiError, closedLabel, Counter, extractTrace, Gauge, ROOT_CONTEXT, statusLabel, tracingEnabled, type Context, type Logger, type Metrics } from '@agentplane/core';
import { corkForTurn, isCluster, onSubscriberReplaced, type Redis } from '@agentplane/store';
import {
  CLOSE, CLOSE_REASON, FrameError, RUNNER_CONNECT_PATH, RUNNER_DEFAULTS, RUNNER_PROTOCOL_VERSIONS, frame, negotiateVersion,
  parseFrame, type GatewayToRunnerType, type LeaseRef, type Payload, type RunnerMessage, type RunnerPresence,
  type RunnerStatus, type RunnerToGatewayType, type Envelope,
} from '@agentplane/protocol';
import { AuthFailure, authenticateRunner, bearerFrom, currentStanding, stillAuthorized, type RunnerIdentity } from './auth.js';
import { GATEWAY_CONTROL_CHANNEL, gatewayNodeChannel, PresenceStore } from './presence.js';
import { advertiseLink, GATEWAY_LINK_PATH, LINK_SEND_BACKLOG_BYTES, takeLinkTicket, type LinkFrame, type NodeLinks } from './link.js';

/** Principal suspensions and deletions, published by the identity service. */
export const PRINCIPAL_CHANGES_CHANNEL = 'ap:principal-changes';

/** Broadcast control messages (GATEWAY_CONTROL_CHANNEL). */
export type GatewayControlMessage =
  | { kind: 'credential_revoked'; workspace_id: string; credential_id: string }
  | { kind: 'drain'; workspace_id: string; runner_id?: string; runner_pool_id?: string; deadline: string; reason: string }
  /** Lift a drain of one runner or of a pool (except the runners that carry a drain of their own). */
  | { kind: 'resume'; workspace_id: string; runner_id?: string; runner_pool_id?: string; except_runner_ids?: string[]; reason: string }
  | { kind: 'supersede'; workspace_id: string; runner_id: string; generation: number; node_id: string }
  /** The Workspace was disabled: its runners' sockets close (4403), as its keys stop working. */
  | { kind: 'workspace_disabled'; workspace_id: string }
  /**
   * A lease ended for its runner: its Run was cancelled (`cancelOnRunner`), or the lease was
   * revoked (a `lease.revoked` frame: lost, fenced, unknown). Not for runner sockets: every API
   * node checks the model streams it serves under that lease against the lease's state in Redis
   * and ends those whose lease no longer holds (docs/MODELS.md).
   */
  | { kind: 'lease_ended'; workspace_id: string; lease_id: string; reason: string };

/**
 * Announce on the control channel that a lease ended (`lease_ended`). Publish it only after the
 * end is in Redis (the fence dropped, or the Run's cancel mark written): a node that hears it
 * reads that state, and so does a node that starts serving the lease just after.
 */
export async function announceLeaseEnded(redis: Redis, workspaceId: string, leaseId: string, reason: string): Promise<void> {
  await redis.publish(GATEWAY_CONTROL_CHANNEL, JSON.stringify({ kind: 'lease_ended', workspace_id: workspaceId, lease_id: leaseId, reason } satisfies GatewayControlMessage));
}

/** A frame for one runner, published on the channel of the node that holds its socket. */
export interface NodeDelivery {
  runner_id: string;
  /** Deliver only to this connection generation (omit: whichever is live). */
  generation?: number;
  /** A complete frame built with `frame()`. */
  frame: string;
  /**
   * Sent to a node named by a routing hint: a node that does not hold the runner forwards the
   * frame once to the node of the runner's presence in this Workspace.
   */
  forward_in?: string;
  /**
   * Published on `channel` by the node that finds the frame cannot be delivered (the runner is
   * connected nowhere, on another generation, or not live): the sender learns it at once instead
   * of waiting out its own timeout. Sent by one node at most.
   */
  undelivered?: { channel: string; message: string };
  /**
   * The frame is this `lease.cancel`: the node holding the runner also repeats it in every
   * `heartbeat.ack` until the runner stops listing the lease.
   */
  cancel?: Payload<'lease.cancel'>;
}

export interface GatewayOptions {
  path: string;
  heartbeatIntervalMs: number;
  presenceTtlMs: number;
  helloTimeoutMs: number;
  maxFrameBytes: number;
  /** Frames per second per connection (token bucket, burst 2×). */
  maxFramesPerSecond: number;
  /** Re-check the credential and owner every this often (backstop to pub/sub). */
  revalidateMs: number;
  /** A runner socket with more than this many bytes waiting to be sent is closed 4413 (`RUNNER_SEND_BACKLOG_BYTES`). */
  maxBacklogBytes: number;
  nodeId: string;
}

/**
 * The send bound of one runner socket: frames the gateway has written for the runner that its
 * socket has not yet handed to the kernel (the WebSocket's `bufferedAmount`; the kernel's own
 * buffers come on top). A runner that stops reading (hung, or its host overloaded) would otherwise
 * make the gateway hold every frame sent to it: a model step streams as fast as its provider
 * answers. Past the bound the connection is closed (4413), never a frame dropped: a lost lease
 * frame would lose work, while a closed runner reconnects and resumes its leases. Eight frames of
 * the largest size fit, so the frames of one turn, held until the turn ends (`corkForTurn`), do not
 * reach it on their own; the Session streams bound a viewer that stops reading the same way.
 */
export const RUNNER_SEND_BACKLOG_BYTES = 8 * 1024 * 1024;

export const DEFAULT_GATEWAY_OPTIONS: Omit<GatewayOptions, 'nodeId'> = {
  path: RUNNER_CONNECT_PATH,
  heartbeatIntervalMs: RUNNER_DEFAULTS.heartbeatIntervalMs,
  presenceTtlMs: RUNNER_DEFAULTS.presenceTtlMs,
  helloTimeoutMs: RUNNER_DEFAULTS.helloTimeoutMs,
  maxFrameBytes: RUNNER_DEFAULTS.maxFrameBytes,
  maxFramesPerSecond: 200,
  revalidateMs: 30_000,
  maxBacklogBytes: RUNNER_SEND_BACKLOG_BYTES,
};

/**
 * Told when a runner's socket goes live, with the leases its hello names as still held: before its
 * welcome is sent, which waits for it (nothing reaches the runner meanwhile).
 */
export type ConnectedListener = (conn: RunnerConnection, heldLeases: readonly LeaseRef[]) => Promise<void>;
/** Called once when a connection this node held is gone (closed, lost or replaced). */
export type ClosedListener = (conn: RunnerConnection) => void;
/**
 * Which of the leases a connecting runner's hello names the control plane still recognises as
 * that runner's (they go back in `welcome.resumed_leases`; the runner abandons the rest).
 */
export type ResumedLeases = (identity: RunnerIdentity, heldLeases: readonly LeaseRef[]) => Promise<LeaseRef[]>;

/** One live runner socket as handlers see it. */
export interface RunnerConnection {
  readonly id: string;
  readonly identity: RunnerIdentity;
  readonly generation: number;
  readonly protocolVersion: number;
  status: RunnerStatus;
  /** Send a validated frame; false when the socket is gone. */
  send<T extends GatewayToRunnerType>(type: T, payload: Payload<T>, re?: string): boolean;
  /** Queue a cancellation: sent now as lease.cancel and repeated in every heartbeat.ack until the runner drops the lease. */
  cancelLease(lease: LeaseRef, reason: string, graceMs: number): void;
  close(code: number, reason?: string): void;
}

/**
 * A frame's handler. `trace`: the context of the runner span the frame was sent in (its
 * envelope's traceparent; the root context when none), the parent of the spans made for it.
 */
export type FrameHandler<T extends RunnerToGatewayType = RunnerToGatewayType> = (conn: RunnerConnection, msg: Envelope<T>, trace: Context) => Promise<void> | void;
export type HandlerTable = { [T in RunnerToGatewayType]?: FrameHandler<T> };

export interface GatewayDeps {
  redis: Redis;
  log: Logger;
  metrics: Metrics;
  options?: Partial<GatewayOptions>;
  /** Handlers for lease, event and model frames (the scheduler and model gateway register theirs). */
  handlers?: HandlerTable;
}

interface Conn extends RunnerConnection {
  ws: WebSocket;
  /** The upgraded connection under `ws`: its frames of one turn leave in one write (`corkForTurn` before each `ws.send`). */
  socket: Duplex;
  state: 'hello' | 'live' | 'closed';
  /** Its hello arrived (the welcome may still be on its way): another hello is a protocol violation. */
  helloSeen: boolean;
  /** Its welcome was sent: frames for the runner go out only from then on. */
  welcomed: boolean;
  /**
   * A drain or resume was announced before the welcome was sent (or while a re-check of one ran):
   * the welcome may carry a drain state read before it, so the state is read again once welcomed.
   */
  controlMissed: boolean;
  /** That re-check is under way (`recheckControl`). */
  controlChecking: boolean;
  capabilities: Payload<'hello'>['capabilities'] | null;
  availableSlots: number;
  placement: 'local' | 'managed';
  cancellations: Map<string, Payload<'lease.cancel'>>;
  tokens: number;
  lastRefill: number;
  lastRevalidate: number;
  generationValue: number;
  versionValue: number;
  graceful: boolean;
}

/** Close codes counted by value: the protocol's and the standard ones; anything a peer makes up is `other`. */
const CLOSE_CODES: ReadonlySet<string> = new Set([...Object.values(CLOSE), 1002, 1003, 1005, 1006, 1007, 1008, 1011].map(String));

/**
 * An upgrading socket is the server's no more (the HTTP server drops its error listener before
 * it emits `upgrade`) and not yet the WebSocket library's: while its credential is checked, and
 * after a refusal was written, a peer that resets the connection would raise an `error` nobody
 * listens to, which ends the process. Until `release` (the library then listens itself), an
 * error destroys the socket and goes no further.
 */
function guardUpgradeSocket(socket: Duplex): { release(): void } {
  const onError = (): void => void socket.destroy();
  socket.on('error', onError);
  return { release: () => void socket.removeListener('error', onError) };
}

/** How long a refused upgrade's socket is kept for its peer to read the refusal and close. */
const REFUSED_SOCKET_MS = 5_000;

const truncate = (s: string): string => (Buffer.byteLength(s) <= 120 ? s : `${Buffer.from(s).subarray(0, 117).toString('utf8')}...`);

export class Gateway {
  readonly options: GatewayOptions;
  readonly presence: PresenceStore;
  private readonly wss: WebSocketServer;
  private readonly conns = new Map<string, Conn>();
  private readonly byRunner = new Map<string, Conn>();
  private readonly handlers: HandlerTable;
  private readonly sub: Redis;
  private readonly log: Logger;
  private readonly metricFrames: Counter<'direction' | 'type'>;
  private readonly metricCloses: Counter<'code'>;
  private readonly metricRejects: Counter<'status'>;
  private closing = false;
  private msgSeq = 0;
  private readonly connectedListeners: ConnectedListener[] = [];
  private readonly closedListeners: ClosedListener[] = [];
  private resumedLeases: ResumedLeases | null = null;
  /** Open node links (senders' direct sockets), and the reply channels each one named. */
  private readonly links = new Set<WebSocket>();
  /** Link frames carry a runner frame as a JSON string (escaping makes it larger). */
  private readonly linkWss: WebSocketServer;
  private readonly linkByChannel = new Map<string, WebSocket>();
  /** Each open link's connection, corked for the rest of the turn by a reply (`corkForTurn`). */
  private readonly linkSockets = new WeakMap<WebSocket, Duplex>();
  private readonly metricLinkFrames: Counter<'direction'>;
  private advertised: { stop(): Promise<void> } | null = null;

  constructor(private readonly deps: GatewayDeps) {
    this.options = { ...DEFAULT_GATEWAY_OPTIONS, nodeId: `gw_${randomBytes(8).toString('hex')}`, ...deps.options };
    this.log = deps.log.child({ component: 'gateway', node: this.options.nodeId });
    this.presence = new PresenceStore(deps.redis);
    this.handlers = { ...deps.handlers };
    this.wss = new WebSocketServer({ noServer: true, maxPayload: this.options.maxFrameBytes, perMessageDeflate: false, clientTracking: false });
    this.linkWss = new WebSocketServer({ noServer: true, maxPayload: this.options.maxFrameBytes * 2 + 65_536, perMessageDeflate: false, clientTracking: false });
    const conns = this.conns;
    new Gauge({ name: 'agentplane_gateway_connected_runners', help: 'Runner sockets open on this gateway node', registers: [deps.metrics], collect() { this.set(conns.size); } });
    this.metricFrames = new Counter({ name: 'agentplane_gateway_frames_total', help: 'Runner protocol frames by direction and type', labelNames: ['direction', 'type'] as const, registers: [deps.metrics] });
    this.metricCloses = new Counter({ name: 'agentplane_gateway_closes_total', help: 'Runner sockets closed, by close code (codes outside the protocol count as other)', labelNames: ['code'] as const, registers: [deps.metrics] });
    this.metricLinkFrames = new Counter({ name: 'agentplane_gateway_link_frames_total', help: 'Frames on node links: deliveries in, replies out', labelNames: ['direction'] as const, registers: [deps.metrics] });
    this.metricRejects = new Counter({ name: 'agentplane_gateway_upgrade_rejections_total', help: 'Refused runner upgrades by HTTP status', labelNames: ['status'] as const, registers: [deps.metrics] });
    this.sub = deps.redis.duplicate({ connectionName: 'agentplane:gateway:control' });
    this.sub.on('error', (err: Error) => this.log.warn({ err: err.message }, 'gateway subscriber error'));
    this.sub.subscribe(...this.channels()).catch((err: unknown) => {
      // Redis did not answer at start (its commands give up after a few retries): the
      // subscriptions are made once it does, by the same path a replaced subscriber takes.
      this.log.warn({ err: err instanceof Error ? err.message : String(err) }, 'gateway not subscribed yet: subscribing once Redis answers');
      this.sub.once('ready', () => void this.resync());
    });
    this.sub.on('message', (channel: string, message: string) => this.onBroadcast(channel, message));
    onSubscriberReplaced(this.sub, () => void this.resync());
  }

  private channels(): string[] {
    return [GATEWAY_CONTROL_CHANNEL, PRINCIPAL_CHANGES_CHANNEL, gatewayNodeChannel(this.options.nodeId)];
  }

  /**
   * The subscriber's connection was replaced (a reconnect, or on a cluster a move to another
   * node): revocations, suspensions, drains and resumes published meanwhile were lost. Once the
   * subscriptions are confirmed again, every live connection is checked against what is stored
   * now: one no longer allowed is closed as a revocation would have closed it, a drain in force
   * is sent (the runner keeps the earlier deadline of two), and a runner that reports a drain
   * no longer in force is told to resume (it lifts only a drain the control plane asked for).
   */
  private async resync(): Promise<void> {
    if (this.closing) return;
    try {
      await this.sub.subscribe(...this.channels());
    } catch (err) {
      this.log.warn({ err: err instanceof Error ? err.message : String(err) }, 'gateway could not re-subscribe; the connections are checked at their next revalidation');
      return;
    }
    // Connections still between their upgrade and their welcome too: one whose registration read
    // the credential before a revocation this subscriber missed would otherwise go live with it.
    const open = [...this.conns.values()].filter((c) => c.state !== 'closed');
    this.log.info({ connections: open.length }, 'gateway subscriber replaced: checking open connections against stored state');
    await Promise.all(open.map(async (conn) => {
      const standing = await currentStanding(this.deps.redis, conn.identity).catch(() => null);
      if (!standing || conn.state === 'closed') return;
      conn.lastRevalidate = Date.now();
      if (standing.verdict !== 'ok') return this.refuse(conn, standing.verdict);
      // A connection not yet welcomed reads the drain in force again once it is (its welcome may
      // carry what its hello read before).
      if (!conn.welcomed || conn.controlChecking) return void (conn.controlMissed = true);
      if (standing.drain) conn.send('drain', standing.drain);
      else if (conn.status === 'draining') conn.send('resume', { reason: 'no drain is in force (rechecked after the control plane reconnected)' });
    }));
  }

  /**
   * Called once a runner's socket is live, before its welcome (which waits for it), with the leases
   * its hello says it still holds; the lease owner uses it to end at once the leases the runner no
   * longer has.
   */
  onConnected(listener: ConnectedListener): void {
    this.connectedListeners.push(listener);
  }

  /**
   * `listener` runs once for every connection this node forgets (its socket closed or lost): what
   * the handlers keep per connection (its model streams) ends with it.
   */
  onDisconnected(listener: ClosedListener): void {
    this.closedListeners.push(listener);
  }

  /**
   * How a hello's `held_leases` are checked: only the leases `judge` recognises are resumed in
   * the welcome. Without one (a gateway with no lease owner) they are echoed back.
   */
  onResume(judge: ResumedLeases): void {
    this.resumedLeases = judge;
  }

  /** Add or replace the handler of one runner→gateway frame type. */
  on<T extends RunnerToGatewayType>(type: T, handler: FrameHandler<T>): void {
    (this.handlers as Record<string, unknown>)[type] = handler;
  }

  get size(): number {
    return this.conns.size;
  }

  /** The live local connection of a runner, if this node holds it. */
  connection(runnerId: string): RunnerConnection | undefined {
    return this.byRunner.get(runnerId);
  }

  /** Handle an HTTP upgrade on our path; returns false for other paths (the caller may handle them). */
  handleUpgrade(req: IncomingMessage, socket: Duplex, head: Buffer): boolean {
    const url = new URL(req.url ?? '/', 'http://gateway');
    if (url.pathname === GATEWAY_LINK_PATH) return this.upgradeLink(req, socket, head);
    if (url.pathname !== this.options.path) return false;
    const guarded = guardUpgradeSocket(socket);
    if (this.closing) {
      this.reject(socket, new ApiError('runtime.internal', 'the gateway is shutting down; reconnect to another instance or retry'));
      return true;
    }
    authenticateRunner(this.deps.redis, bearerFrom(req.headers.authorization)).then(
      (identity) => {
        guarded.release();
        this.wss.handleUpgrade(req, socket, head, (ws) => this.accept(ws, identity, socket));
      },
      (err: unknown) => {
        if (err instanceof AuthFailure) {
          this.reject(socket, new ApiError(err.type, err.message));
        } else {
          const incident = `inc_${randomBytes(8).toString('hex')}`;
          this.log.error({ err, incident }, 'runner upgrade failed');
          this.reject(socket, new ApiError('runtime.internal', `the gateway cannot authenticate right now; retry (incident reference ${incident})`));
        }
      },
    );
    return true;
  }

  /**
   * Advertise this node's link endpoint (docs/ARCHITECTURE.md, "Node links"): schedulers then send
   * its runners' frames over a direct socket instead of through Redis pub/sub.
   */
  advertiseLink(url: string): void {
    if (this.closing || this.advertised) return;
    this.advertised = advertiseLink(this.deps.redis, this.options.nodeId, url, this.log);
    this.log.info({ url }, 'gateway link advertised');
  }

  /** A sender's link upgrade: accepted only with a one-time ticket written for this node. */
  private upgradeLink(req: IncomingMessage, socket: Duplex, head: Buffer): boolean {
    const guarded = guardUpgradeSocket(socket);
    if (this.closing) {
      this.reject(socket, new ApiError('runtime.internal', 'the gateway is shutting down'));
      return true;
    }
    takeLinkTicket(this.deps.redis, this.options.nodeId, bearerFrom(req.headers.authorization) ?? undefined).then(
      (ok) => {
        if (!ok) return this.reject(socket, new ApiError('auth.invalid_key', 'unknown, used or expired link ticket'));
        guarded.release();
        this.linkWss.handleUpgrade(req, socket, head, (ws) => this.acceptLink(ws, socket));
      },
      (err: unknown) => {
        this.log.warn({ err: err instanceof Error ? err.message : String(err) }, 'link upgrade failed');
        this.reject(socket, new ApiError('runtime.internal', 'the gateway cannot check the link ticket right now; retry'));
      },
    );
    return true;
  }

  private acceptLink(ws: WebSocket, socket: Duplex): void {
    if (this.closing) return void ws.close(CLOSE.GOING_AWAY);
    this.links.add(ws);
    this.linkSockets.set(ws, socket);
    const channels: string[] = [];
    ws.on('message', (data) => {
      let f: LinkFrame;
      try {
        f = JSON.parse(String(data)) as LinkFrame;
      } catch {
        return;
      }
      if (f.k === 'd' && f.d && typeof f.d.runner_id === 'string' && typeof f.d.frame === 'string') {
        this.metricLinkFrames.inc({ direction: 'in' });
        this.deliver(f.d);
      } else if (f.k === 'hello' && Array.isArray(f.reply_channels)) {
        for (const ch of f.reply_channels) {
          if (typeof ch !== 'string') continue;
          channels.push(ch);
          this.linkByChannel.set(ch, ws);
        }
      }
    });
    ws.on('error', () => undefined);
    ws.on('close', () => {
      this.links.delete(ws);
      for (const ch of channels) if (this.linkByChannel.get(ch) === ws) this.linkByChannel.delete(ch);
    });
  }

  /**
   * A message for a sender's channel: over the sender's link when it named the channel on one,
   * else published (the channel's subscribers get it either way). Resolves once sent (a frame on
   * a link leaves with the turn's other frames on it, at the turn's end).
   */
  async sendToChannel(channel: string, message: string): Promise<void> {
    const ws = this.linkByChannel.get(channel);
    if (ws && ws.readyState === ws.OPEN && ws.bufferedAmount > LINK_SEND_BACKLOG_BYTES) {
      // The sender is not reading its link: closed, and this message and later ones published.
      this.log.warn({ channel, waiting_bytes: ws.bufferedAmount, bound_bytes: LINK_SEND_BACKLOG_BYTES }, 'a link\'s sender is not reading it; closed, replies go by pub/sub');
      ws.terminate();
    } else if (ws && ws.readyState === ws.OPEN) {
      this.metricLinkFrames.inc({ direction: 'out' });
      const socket = this.linkSockets.get(ws);
      if (socket) corkForTurn(socket);
      return void ws.send(JSON.stringify({ k: 'r', channel, message } satisfies LinkFrame));
    }
    await this.deps.redis.publish(channel, message);
  }

  /** Refuse an upgrade with a plain HTTP answer: the wire error body of a catalog type. */
  private reject(socket: Duplex, err: ApiError): void {
    const { status } = err;
    this.metricRejects.inc({ status: statusLabel(status) });
    const body = JSON.stringify({ error: { type: err.type, message: err.message } });
    const text = STATUS_CODES[status] ?? 'Error';
    socket.end(`HTTP/1.1 ${status} ${text}\r\nContent-Type: application/json\r\nContent-Length: ${Buffer.byteLength(body)}\r\nConnection: close\r\n\r\n${body}`);
    // A peer that never closes its side does not keep the socket.
    setTimeout(() => socket.destroy(), REFUSED_SOCKET_MS).unref();
  }

  private nextId(): string {
    return `g${(++this.msgSeq).toString(36)}`;
  }

  private accept(ws: WebSocket, identity: RunnerIdentity, socket: Duplex): void {
    const gw = this;
    const now = Date.now();
    const conn: Conn = {
      id: `c_${randomBytes(8).toString('hex')}`,
      identity,
      ws,
      socket,
      state: 'hello',
      helloSeen: false,
      welcomed: false,
      controlMissed: false,
      controlChecking: false,
      status: 'starting',
      capabilities: null,
      availableSlots: 0,
      placement: identity.placement === 'managed' ? 'managed' : 'local',
      cancellations: new Map(),
      tokens: this.options.maxFramesPerSecond * 2,
      lastRefill: now,
      lastRevalidate: now,
      generationValue: 0,
      versionValue: 0,
      graceful: false,
      get generation() {
        return this.generationValue;
      },
      get protocolVersion() {
        return this.versionValue;
      },
      send(type, payload, re) {
        // Every revocation a runner is told of passes here: announced to every node, so that the
        // model streams served under the lease end wherever they run. Those nodes check the
        // lease in Redis first: an announcement of a lease that still holds ends nothing.
        if (type === 'lease.revoked') gw.leaseRevoked(identity.workspaceId, payload as Payload<'lease.revoked'>);
        if (ws.readyState !== ws.OPEN) return false;
        // Frames for one runner in one turn (offers and acknowledgements answered from one read
        // of Redis's answers) leave in one write.
        corkForTurn(socket);
        ws.send(frame(type, gw.nextId(), payload, re));
        gw.metricFrames.inc({ direction: 'out', type });
        gw.checkBacklog(conn);
        return true;
      },
      cancelLease(lease, reason, graceMs) {
        const p = { lease_id: lease.lease_id, attempt: lease.attempt, reason, grace_ms: graceMs };
        this.cancellations.set(`${lease.lease_id}#${lease.attempt}`, p);
        this.send('lease.cancel', p);
      },
      close(code, reason) {
        gw.closeConn(conn, code, reason);
      },
    };
    this.conns.set(conn.id, conn);
    const helloTimer = setTimeout(() => {
      if (conn.state === 'hello') this.closeConn(conn, CLOSE.HELLO_TIMEOUT);
    }, this.options.helloTimeoutMs);
    helloTimer.unref();

    ws.on('message', (data, isBinary) => {
      if (conn.state === 'closed') return;
      if (!this.takeToken(conn)) return this.closeConn(conn, CLOSE.RATE_LIMITED);
      if (isBinary) return this.closeConn(conn, CLOSE.MALFORMED, 'binary frames are not accepted');
      let msg: RunnerMessage;
      try {
        msg = parseFrame(Buffer.isBuffer(data) ? data.toString('utf8') : Buffer.concat(data as Buffer[]).toString('utf8'), 'runner');
      } catch (err) {
        this.metricFrames.inc({ direction: 'in', type: 'invalid' });
        return this.closeConn(conn, CLOSE.MALFORMED, err instanceof FrameError ? err.message : 'malformed frame');
      }
      this.metricFrames.inc({ direction: 'in', type: msg.type });
      // A frame sent inside a runner span (envelope traceparent): its handler continues that trace.
      const trace = tracingEnabled() && msg.traceparent ? extractTrace({ traceparent: msg.traceparent, ...(msg.tracestate ? { tracestate: msg.tracestate } : {}) }) : ROOT_CONTEXT;
      const handled = this.dispatch(conn, msg, trace);
      handled.catch((err: unknown) => {
        this.log.error({ err, runner: identity.runnerId, type: msg.type }, 'runner frame handler failed');
        conn.send('error', { code: 'internal', message: 'the gateway failed to handle this frame', retryable: true }, msg.id);
      });
    });
    ws.on('error', (err) => this.log.debug({ err: err.message, runner: identity.runnerId }, 'runner socket error'));
    ws.on('close', (code) => {
      clearTimeout(helloTimer);
      this.onClosed(conn, code);
    });
  }

  /** A `lease.revoked` sent to a runner, announced to every node (`lease_ended`). */
  private leaseRevoked(workspaceId: string, p: Payload<'lease.revoked'>): void {
    announceLeaseEnded(this.deps.redis, workspaceId, p.lease_id, p.reason).catch((err: unknown) => {
      this.log.warn({ err: err instanceof Error ? err.message : String(err), lease: p.lease_id }, 'cannot announce a revoked lease');
    });
  }

  /**
   * After a frame was written for a runner: a runner with more than the send bound waiting for it
   * is closed 4413 (`RUNNER_SEND_BACKLOG_BYTES`). The frame just written stays queued before the
   * close frame; a runner that reads again gets both, one that does not is cut off with the rest.
   */
  private checkBacklog(conn: Conn): void {
    const waiting = conn.ws.bufferedAmount;
    if (waiting <= this.options.maxBacklogBytes || conn.state === 'closed') return;
    this.log.warn({ runner: conn.identity.runnerId, generation: conn.generationValue, waiting_bytes: waiting, bound_bytes: this.options.maxBacklogBytes }, 'runner is not reading its socket; closed');
    this.closeConn(conn, CLOSE.BACKLOGGED);
  }

  private takeToken(conn: Conn): boolean {
    const now = Date.now();
    const rate = this.options.maxFramesPerSecond;
    conn.tokens = Math.min(rate * 2, conn.tokens + ((now - conn.lastRefill) / 1000) * rate);
    conn.lastRefill = now;
    if (conn.tokens < 1) return false;
    conn.tokens -= 1;
    return true;
  }

  private async dispatch(conn: Conn, msg: RunnerMessage, trace: Context): Promise<void> {
    if (msg.type === 'hello') {
      if (conn.state !== 'hello' || conn.helloSeen) return this.closeConn(conn, CLOSE.PROTOCOL_VIOLATION, 'hello sent twice');
      conn.helloSeen = true;
      return this.onHello(conn, msg);
    }
    if (conn.state !== 'live') return this.closeConn(conn, CLOSE.PROTOCOL_VIOLATION, `'${msg.type}' before hello`);
    switch (msg.type) {
      case 'heartbeat':
        return this.onHeartbeat(conn, msg);
      case 'drained':
        conn.graceful = true;
        conn.send('ack', {}, msg.id);
        return this.closeConn(conn, CLOSE.DRAINED);
      case 'ack':
      case 'error':
        if (!this.handlers[msg.type]) return;
        break;
      default:
        break;
    }
    const handler = this.handlers[msg.type] as FrameHandler | undefined;
    if (!handler) {
      conn.send('error', { code: 'unsupported', message: `no handler for '${msg.type}' on this control plane yet`, retryable: false }, msg.id);
      return;
    }
    await handler(conn, msg, trace);
  }

  private presenceOf(conn: Conn, now: number): RunnerPresence {
    const id = conn.identity;
    return {
      runner: id.runnerId,
      runner_pool: id.runnerPoolId,
      generation: conn.generationValue,
      placement: conn.placement,
      status: conn.status,
      capabilities: { ...conn.capabilities!, available_slots: conn.availableSlots },
      placement_conformance_digests: [],
      last_seen_at: new Date(now).toISOString(),
      expires_at: new Date(now + this.options.presenceTtlMs).toISOString(),
      ...(id.owner ? { owner: { principal: id.owner.principal, machine_label: id.owner.machine_label } } : {}),
    };
  }

  private async writePresence(conn: Conn): Promise<RunnerPresence> {
    const p = this.presenceOf(conn, Date.now());
    // A connection that closed while its handler was reading (a heartbeat's standing re-check, a
    // hello's generation announcement) writes nothing: a graceful close has removed its presence
    // already, and this write would bring it back for a TTL, offered work, to a runner that left.
    // A close that comes after this write removes it behind it, on the same connection and slot.
    if (conn.state === 'closed') return p;
    const ok = await this.presence.write(
      conn.identity.workspaceId,
      { presence: p, route: { node_id: this.options.nodeId, connection_id: conn.id, credential_id: conn.identity.credentialId } },
      this.options.presenceTtlMs,
    );
    if (!ok) this.closeConn(conn, CLOSE.SUPERSEDED);
    return p;
  }

  private async onHello(conn: Conn, msg: Envelope<'hello'>): Promise<void> {
    const p = msg.payload;
    const version = negotiateVersion(p.protocol_versions);
    if (version === null) {
      conn.send('error', { code: 'unsupported_version', message: `this gateway speaks protocol versions ${RUNNER_PROTOCOL_VERSIONS.join(', ')}`, retryable: false }, msg.id);
      return this.closeConn(conn, CLOSE.UNSUPPORTED_VERSION);
    }
    const id = conn.identity;
    conn.versionValue = version;
    conn.capabilities = p.capabilities;
    conn.availableSlots = p.capabilities.available_slots;
    conn.status = p.status;
    // The credential and its owner are read again now that this connection is registered (a
    // revocation announced from here on closes it): one revoked after the upgrade's check, its
    // announcement sent before the connection was there to hear it, is refused here, not left
    // to the standing re-check. The same read gives the drain in force (its own, else its pool's).
    const [generation, standing, resumed] = await Promise.all([
      this.presence.nextGeneration(id.workspaceId, id.runnerId),
      currentStanding(this.deps.redis, id),
      this.resumable(id, p.held_leases),
    ]);
    conn.generationValue = generation;
    if (conn.state === 'closed') return;
    conn.lastRevalidate = Date.now();
    if (standing.verdict !== 'ok') return this.refuse(conn, standing.verdict);
    // One live socket per runner: an older one (here or on another node) is closed.
    const prior = this.byRunner.get(id.runnerId);
    if (prior && prior !== conn) this.closeConn(prior, CLOSE.SUPERSEDED);
    this.byRunner.set(id.runnerId, conn);
    conn.state = 'live';
    // Generation 1 is the runner's first connection ever: nothing anywhere to supersede.
    if (conn.generationValue > 1) await this.deps.redis.publish(
      GATEWAY_CONTROL_CHANNEL,
      JSON.stringify({ kind: 'supersede', workspace_id: id.workspaceId, runner_id: id.runnerId, generation: conn.generationValue, node_id: this.options.nodeId } satisfies GatewayControlMessage),
    );
    const drain = standing.drain;
    await this.writePresence(conn);
    // The lease owner settles the leases the hello no longer names before the welcome: nothing
    // reaches the runner until then (`deliver`), so an offer it accepts on this connection is never
    // taken for one its previous process held, and abandoned as it starts.
    await Promise.all(this.connectedListeners.map((listener) => listener(conn, p.held_leases).catch((err: unknown) => {
      this.log.warn({ err: err instanceof Error ? err.message : String(err), runner: id.runnerId }, 'runner connect listener failed');
    })));
    if (conn.state !== 'live') return;
    conn.send(
      'welcome',
      {
        protocol_version: version,
        runner_id: id.runnerId,
        runner_pool_id: id.runnerPoolId,
        workspace_id: id.workspaceId,
        generation: conn.generationValue,
        heartbeat_interval_ms: this.options.heartbeatIntervalMs,
        presence_ttl_ms: this.options.presenceTtlMs,
        max_frame_bytes: this.options.maxFrameBytes,
        server_time: new Date().toISOString(),
        resumed_leases: resumed,
        ...(drain ? { drain } : {}),
      },
      msg.id,
    );
    conn.welcomed = true;
    if (conn.controlMissed) void this.recheckControl(conn, drain !== null);
    this.log.info({ runner: id.runnerId, generation: conn.generationValue, version }, 'runner connected');
  }

  /**
   * The held leases the lease owner still recognises as this runner's. Lease authority is the
   * lease owner's: a lease it cannot judge now (Redis failing) is resumed, and the lease's next
   * frame finds out.
   */
  private async resumable(id: RunnerIdentity, held: readonly LeaseRef[]): Promise<LeaseRef[]> {
    if (held.length === 0 || !this.resumedLeases) return [...held];
    try {
      return await this.resumedLeases(id, held);
    } catch (err) {
      this.log.warn({ err: err instanceof Error ? err.message : String(err), runner: id.runnerId }, 'cannot check the leases a runner resumes; all are resumed');
      return [...held];
    }
  }

  private async onHeartbeat(conn: Conn, msg: Envelope<'heartbeat'>): Promise<void> {
    const p = msg.payload;
    conn.status = p.status;
    conn.availableSlots = p.available_slots;
    if (p.capabilities) conn.capabilities = p.capabilities;
    const held = new Set(p.held_leases.map((l) => `${l.lease_id}#${l.attempt}`));
    for (const k of conn.cancellations.keys()) if (!held.has(k)) conn.cancellations.delete(k);
    const now = Date.now();
    if (now - conn.lastRevalidate >= this.options.revalidateMs) {
      conn.lastRevalidate = now;
      const verdict = await stillAuthorized(this.deps.redis, conn.identity);
      if (verdict !== 'ok') return this.refuse(conn, verdict);
    }
    const presence = await this.writePresence(conn);
    conn.send(
      'heartbeat.ack',
      {
        server_time: new Date().toISOString(),
        presence_expires_at: presence.expires_at,
        cancellations: [...conn.cancellations.values()].map(({ lease_id, attempt, reason }) => ({ lease_id, attempt, reason })),
      },
      msg.id,
    );
  }

  /**
   * A drain or resume announced while a connection was being welcomed: the drain state is read
   * again and the runner told what its welcome (`draining`: it carried a drain) got wrong, a
   * drain in force or a drain lifted. Announcements meanwhile make it read once more.
   */
  private async recheckControl(conn: Conn, draining: boolean): Promise<void> {
    conn.controlChecking = true;
    try {
      while (conn.controlMissed && conn.state === 'live') {
        conn.controlMissed = false;
        const standing = await currentStanding(this.deps.redis, conn.identity);
        if (conn.state !== 'live') return;
        conn.lastRevalidate = Date.now();
        if (standing.verdict !== 'ok') return this.refuse(conn, standing.verdict);
        if (standing.drain) conn.send('drain', standing.drain);
        else if (draining) conn.send('resume', { reason: 'no drain is in force (rechecked after a drain or resume announced while the runner connected)' });
        draining = standing.drain !== null;
      }
    } catch (err) {
      this.log.warn({ err: err instanceof Error ? err.message : String(err), runner: conn.identity.runnerId }, 'cannot read the drain state again after a drain or resume announced while the runner connected');
    } finally {
      conn.controlChecking = false;
    }
  }

  /** Close a connection its credential no longer allows: revoked (4401), or its owner or tenancy not active (4403). */
  private refuse(conn: Conn, verdict: 401 | 403): void {
    this.closeConn(conn, verdict === 401 ? CLOSE.UNAUTHORIZED : CLOSE.FORBIDDEN);
  }

  private closeConn(conn: Conn, code: number, reason?: string): void {
    if (conn.state === 'closed') return;
    conn.state = 'closed';
    this.metricCloses.inc({ code: closedLabel(String(code), CLOSE_CODES) });
    const text = truncate(reason ?? CLOSE_REASON[code] ?? 'closed');
    if (code === CLOSE.DRAINED || code === CLOSE.UNAUTHORIZED || code === CLOSE.FORBIDDEN || code === CLOSE.NORMAL) conn.graceful = true;
    try {
      conn.ws.close(code, text);
    } catch {
      conn.ws.terminate();
    }
    // A peer that never answers the close handshake is cut off.
    setTimeout(() => conn.ws.terminate(), 2_000).unref();
    this.forget(conn);
  }

  private onClosed(conn: Conn, code: number): void {
    if (conn.state !== 'closed') {
      conn.state = 'closed';
      this.metricCloses.inc({ code: closedLabel(String(code), CLOSE_CODES) });
      if (code === CLOSE.NORMAL || code === CLOSE.DRAINED) conn.graceful = true;
    }
    this.forget(conn);
  }

  private forget(conn: Conn): void {
    if (!this.conns.delete(conn.id)) return;
    for (const listener of this.closedListeners) {
      try {
        listener(conn);
      } catch (err) {
        this.log.warn({ err: err instanceof Error ? err.message : String(err), runner: conn.identity.runnerId }, 'a closed-connection listener failed');
      }
    }
    const id = conn.identity;
    if (this.byRunner.get(id.runnerId) === conn) this.byRunner.delete(id.runnerId);
    // A graceful goodbye removes the presence at once; a lost socket leaves it to expire (the
    // runner may be reconnecting inside the TTL).
    if (conn.graceful && conn.generationValue > 0) {
      this.presence.remove(id.workspaceId, id.runnerId, conn.generationValue, id.runnerPoolId).catch((err: unknown) => this.log.warn({ err }, 'presence remove failed'));
    }
  }

  private onBroadcast(channel: string, message: string): void {
    let msg: unknown;
    try {
      msg = JSON.parse(message);
    } catch {
      return;
    }
    if (channel === PRINCIPAL_CHANGES_CHANNEL) {
      const m = msg as { workspace_id?: string; principal_id?: string; status?: string };
      if (m.status !== 'suspended' && m.status !== 'deleted') return;
      for (const c of [...this.conns.values()]) {
        if (c.identity.owner?.principal === m.principal_id && c.identity.workspaceId === m.workspace_id) this.closeConn(c, CLOSE.FORBIDDEN, `owner Principal ${m.status}`);
      }
      return;
    }
    if (channel === GATEWAY_CONTROL_CHANNEL) {
      const m = msg as GatewayControlMessage;
      // For the model streams of the API nodes (they subscribe on their own), not for sockets.
      if (m.kind === 'lease_ended') return;
      // Per-runner messages are O(1) lookups (a connect storm must not cost O(N) per connect).
      if (m.kind === 'supersede') {
        const c = this.byRunner.get(m.runner_id);
        if (c && c.identity.workspaceId === m.workspace_id && c.generationValue < m.generation && c.state === 'live') this.closeConn(c, CLOSE.SUPERSEDED);
        return;
      }
      for (const c of [...this.conns.values()]) {
        const id = c.identity;
        if (id.workspaceId !== m.workspace_id) continue;
        if (m.kind === 'credential_revoked' && id.credentialId === m.credential_id) this.closeConn(c, CLOSE.UNAUTHORIZED, 'runner credential revoked');
        else if (m.kind === 'workspace_disabled') this.closeConn(c, CLOSE.FORBIDDEN, 'workspace disabled');
        else if ((m.kind === 'drain' || m.kind === 'resume') && (m.runner_id === id.runnerId || m.runner_pool_id === id.runnerPoolId) && c.state !== 'closed') {
          // Not welcomed yet: its welcome carries the drain state its hello read, which may be from
          // before this announcement, so the state is read again once the welcome is sent (a
          // frame sent now would go ahead of the welcome, which then undoes it).
          if (!c.welcomed || c.controlChecking) c.controlMissed = true;
          else if (m.kind === 'drain') c.send('drain', { deadline: m.deadline, reason: m.reason });
          else if (!m.except_runner_ids?.includes(id.runnerId)) c.send('resume', { reason: m.reason });
        }
      }
      return;
    }
    // Our node channel: a frame for one of our runners.
    this.deliver(msg as NodeDelivery);
  }

  /** A frame for one of our runners (from our node channel or a node link). */
  private deliver(d: NodeDelivery): void {
    const c = this.byRunner.get(d.runner_id);
    // Nothing goes ahead of the welcome: the runner would take an offer before it, and the welcome
    // (whose resumed leases do not name it) would then make it drop the lease it just accepted.
    if (!c || c.state !== 'live' || !c.welcomed || (d.generation !== undefined && d.generation !== c.generationValue)) {
      if (d.forward_in !== undefined && !c) return void this.forward(d, d.forward_in);
      this.log.debug({ runner: d.runner_id }, 'delivery for a runner not connected here; dropped');
      void this.undelivered(d);
      return;
    }
    if (d.cancel) return c.cancelLease(d.cancel, d.cancel.reason, d.cancel.grace_ms);
    corkForTurn(c.socket);
    c.ws.send(d.frame);
    this.metricFrames.inc({ direction: 'out', type: 'delivered' });
    this.checkBacklog(c);
  }

  /** A hinted delivery for a runner connected elsewhere: once to the node of its presence. */
  private async forward(d: NodeDelivery, workspaceId: string): Promise<void> {
    try {
      const stored = await this.presence.get(workspaceId, d.runner_id);
      if (!stored || stored.route.node_id === this.options.nodeId) {
        this.log.debug({ runner: d.runner_id }, 'hinted delivery for a runner without a presence elsewhere; dropped');
        return void (await this.undelivered(d));
      }
      const { forward_in: _hint, ...once } = d;
      // Nobody listening there (its node died with the presence still fresh): nobody else will say so.
      if ((await this.deps.redis.publish(gatewayNodeChannel(stored.route.node_id), JSON.stringify(once))) === 0 && !isCluster(this.deps.redis)) {
        await this.undelivered(d);
      }
    } catch (err) {
      this.log.warn({ err: err instanceof Error ? err.message : String(err), runner: d.runner_id }, 'forwarding a hinted delivery failed');
    }
  }

  /** Tell the sender of a frame this node could not deliver (when it asked to be told). */
  private async undelivered(d: NodeDelivery): Promise<void> {
    if (!d.undelivered) return;
    await this.sendToChannel(d.undelivered.channel, d.undelivered.message).catch((err: unknown) => {
      this.log.warn({ err: err instanceof Error ? err.message : String(err), runner: d.runner_id }, 'cannot report an undelivered frame');
    });
  }

  /** Stop accepting, close every socket with 1001 (runners reconnect elsewhere), unsubscribe. */
  async close(): Promise<void> {
    this.closing = true;
    await this.advertised?.stop();
    for (const ws of this.links) ws.close(CLOSE.GOING_AWAY);
    for (const c of [...this.conns.values()]) this.closeConn(c, CLOSE.GOING_AWAY, 'gateway restarting');
    await this.sub.quit().catch(() => this.sub.disconnect());
    await new Promise<void>((r) => this.wss.close(() => r()));
    await new Promise<void>((r) => this.linkWss.close(() => r()));
  }
}

/**
 * Route a frame to a runner wherever its socket is: read its presence route and publish on
 * that gateway node's channel. False when the runner has no live presence. With `nodeId` (the
 * node the caller saw the runner on), straight to that node: over its link when `links` has one
 * open, else published on its channel.
 */
export async function deliverToRunner(
  redis: Redis, workspaceId: string, runnerId: string, frameText: string,
  options: { generation?: number; nodeId?: string; undelivered?: NodeDelivery['undelivered']; cancel?: Payload<'lease.cancel'>; links?: NodeLinks } = {},
): Promise<boolean> {
  const { generation, nodeId, undelivered, cancel, links } = options;
  const base: NodeDelivery = {
    runner_id: runnerId, frame: frameText, ...(generation !== undefined ? { generation } : {}), ...(undelivered ? { undelivered } : {}), ...(cancel ? { cancel } : {}),
  };
  if (nodeId) {
    // Straight to the node the caller saw the runner on: one round trip instead of two. A node
    // that no longer holds the socket forwards it once, along the runner's current presence.
    const hinted: NodeDelivery = { ...base, forward_in: workspaceId };
    // Over the node's link when one is open: one hop, no Redis in between.
    if (links?.send(nodeId, hinted)) return true;
    // On a Redis Cluster the count covers one node's subscribers only, while the message reaches
    // every node: a second publish there could deliver the frame twice.
    if ((await redis.publish(gatewayNodeChannel(nodeId), JSON.stringify(hinted))) > 0 || isCluster(redis)) return true;
  }
  const stored = await new PresenceStore(redis).get(workspaceId, runnerId);
  if (!stored) return false;
  const receivers = await redis.publish(gatewayNodeChannel(stored.route.node_id), JSON.stringify(base));
  // On a Redis Cluster PUBLISH counts only the subscribers of the node it ran on (the message
  // itself reaches every node): there a live presence is the best answer, and a node that died
  // with its presence still fresh costs the sender its own timeout, as a lost frame would.
  return receivers > 0 || isCluster(redis);
}

/**
 * `lease.cancel` to the runner holding a lease, wherever its socket is (`deliverToRunner`): the
 * node holding it sends the frame and repeats it in every `heartbeat.ack` until the runner stops
 * listing the lease. The lease's end is announced to every node too (`lease_ended`), so the model
 * streams served under it end on whichever node serves them. Those nodes read the Run's cancel
 * mark, which is in Redis before this publish: the scheduler cancels a Run it found marked, and
 * `RunEngine.interruptRequested` sends the mark ahead of the fence read this cancel waits for,
 * on the same connection and slot.
 */
export async function cancelOnRunner(redis: Redis, workspaceId: string, runnerId: string, payload: Payload<'lease.cancel'>, eventId: string): Promise<boolean> {
  const [delivered] = await Promise.all([
    deliverToRunner(redis, workspaceId, runnerId, frame('lease.cancel', eventId, payload), { cancel: payload }),
    announceLeaseEnded(redis, workspaceId, payload.lease_id, payload.reason),
  ]);
  return delivered;
}

/**
 * Attach the runner gateway to an HTTP server: upgrades on the runner path go to it. Upgrades on
 * other paths are left to other listeners, or refused when there are none.
 */
export function attachGateway(server: Server, deps: GatewayDeps): Gateway {
  const gw = new Gateway(deps);
  const onUpgrade = (req: IncomingMessage, socket: Duplex, head: Buffer) => {
    if (gw.handleUpgrade(req, socket, head)) return;
    if (server.listeners('upgrade').every((l) => l === onUpgrade)) socket.destroy();
  };
  server.on('upgrade', onUpgrade);
  return gw;
}
