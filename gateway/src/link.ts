import { randomBytes } from 'node:crypto';
import { WebSocket } from 'ws';
import { ConfigError, Counter, envOptional, secretDigest, type Env, type Logger, type Metrics } from '@agentplane/core';
import { keys, type Redis } from '@agentplane/store';
import type { NodeDelivery } from './gateway.js';

/**
 * Node links: a scheduler's direct WebSocket to a gateway node, so that a frame for a runner
 * (an offer, its spec) reaches the node holding the runner's socket in one hop instead of two
 * through Redis pub/sub, and the node's answer (an offer's acceptance, an undelivered frame)
 * comes back the same way. Pub/sub stays the route whenever there is no open link.
 *
 * A gateway node advertises the URL of its link endpoint under its node id (a key that expires
 * unless the node refreshes it). A sender proves it may send the way it would have had to
 * publish: with Redis. It writes a one-time ticket's digest, bound to the node id, and presents
 * the ticket on the upgrade; the node takes (GETDEL) the digest and accepts only a ticket
 * written for itself. Nothing long-lived is stored: a ticket lives 10 s and serves one upgrade.
 *
 *   ap:{g:gw_link:<node>}:gw_link:<node>               JSON {url}, PX 30 s, refreshed every 10 s
 *   ap:{g:gw_link_ticket:<digest>}:gw_link_ticket:<digest>   the node id, PX 10 s
 *
 * Frames on a link are JSON text: from the sender `{"k":"hello","reply_channels":[...]}` once,
 * then `{"k":"d","d":<NodeDelivery>}`; from the node `{"k":"r","channel":...,"message":...}`,
 * a message the node would otherwise have published on that channel.
 */
export const GATEWAY_LINK_PATH = '/internal/gateway-link';

const ADVERTISE_TTL_MS = 30_000;
const ADVERTISE_EVERY_MS = 10_000;
const TICKET_TTL_MS = 10_000;
/** A node that could not be linked is tried again after this long (pub/sub meanwhile). */
const RETRY_AFTER_MS = 5_000;
const PING_EVERY_MS = 15_000;
const MAX_LINKS = 1_024;
/**
 * A link with more than this many bytes waiting to be sent (its WebSocket's `bufferedAmount`: what
 * the kernel would not take yet) is closed: its peer is not reading. Its frames go by pub/sub from
 * then on, where Redis's own output-buffer limit bounds what a subscriber that does not read can
 * hold; the sender links again after `RETRY_AFTER_MS`. Frames still queued on the closed link are
 * lost, as a subscriber's are when Redis cuts it off (an offer's answer is then recovered from the
 * Session fence, an offer is withdrawn when its window ends).
 */
export const LINK_SEND_BACKLOG_BYTES = 8 * 1024 * 1024;

const advertiseKey = (nodeId: string): string => keys.global(`gw_link:${nodeId}`);
const ticketKey = (digest: string): string => keys.global(`gw_link_ticket:${digest}`);

export type LinkFrame =
  | { k: 'hello'; reply_channels: string[] }
  | { k: 'd'; d: NodeDelivery }
  | { k: 'r'; channel: string; message: string };

/** The link URL of a node as it advertises it (null: the node has no link; use pub/sub). */
export async function linkUrlOf(redis: Redis, nodeId: string): Promise<string | null> {
  const raw = await redis.get(advertiseKey(nodeId));
  if (!raw) return null;
  try {
    const { url } = JSON.parse(raw) as { url?: unknown };
    return typeof url === 'string' ? url : null;
  } catch {
    return null;
  }
}

/** Keeps a node's link URL advertised until `stop()`. */
export function advertiseLink(redis: Redis, nodeId: string, url: string, log: Logger): { stop(): Promise<void> } {
  const value = JSON.stringify({ url });
  const write = () => redis.set(advertiseKey(nodeId), value, 'PX', ADVERTISE_TTL_MS).catch((err: unknown) => {
    log.warn({ err: err instanceof Error ? err.message : String(err) }, 'cannot advertise the gateway link');
  });
  void write();
  const timer = setInterval(() => void write(), ADVERTISE_EVERY_MS);
  timer.unref();
  return {
    async stop() {
      clearInterval(timer);
      await redis.del(advertiseKey(nodeId)).catch(() => undefined);
    },
  };
}

/** The node's check of an upgrade's ticket: true only once, and only for a ticket written for `nodeId`. */
export async function takeLinkTicket(redis: Redis, nodeId: string, ticket: string | undefined): Promise<boolean> {
  if (!ticket || ticket.length > 200) return false;
  return (await redis.getdel(ticketKey(secretDigest(ticket)))) === nodeId;
}

/**
 * `GATEWAY_LINK_URL`: a `ws://` or `wss://` origin, or `off` (null: advertise no link). Undefined
 * when unset (the listen address is used, `linkUrlFor`).
 */
export function gatewayLinkUrlFrom(env: Env): string | null | undefined {
  const raw = envOptional(env, 'GATEWAY_LINK_URL');
  if (raw === undefined) return undefined;
  if (raw === 'off') return null;
  if (!/^wss?:\/\/[^/\s]+\/?$/.test(raw)) throw new ConfigError(`GATEWAY_LINK_URL must be ws://host:port, wss://host:port or off (got ${JSON.stringify(raw)})`);
  return raw;
}

/** The ws URL a node's link is reached at, from the address its server listens on. */
export function linkUrlFor(host: string, port: number, explicit?: string): string {
  if (explicit) return explicit.replace(/\/+$/, '');
  const h = host === '0.0.0.0' || host === '' ? '127.0.0.1' : host === '::' ? '[::1]' : host.includes(':') && !host.startsWith('[') ? `[${host}]` : host;
  return `ws://${h}:${port}`;
}

interface Link {
  ws: WebSocket | null;
  open: boolean;
  /** When a link that failed may be tried again (0: trying now, or open). */
  retryAt: number;
  alive: boolean;
}

export interface NodeLinksOptions {
  redis: Redis;
  log: Logger;
  /** Channels whose messages nodes may send back over the link instead of publishing them. */
  replyChannels: readonly string[];
  onReply(channel: string, message: string): void;
  metrics?: Metrics;
}

/**
 * The sender's side: one link per gateway node it sends to, opened on first use (the first
 * frames to a node go by pub/sub meanwhile), kept alive with pings, dropped when it fails.
 */
export class NodeLinks {
  private readonly links = new Map<string, Link>();
  private readonly sends: Counter<'route'>;
  private readonly pinger: NodeJS.Timeout;
  private closed = false;

  constructor(private readonly o: NodeLinksOptions) {
    this.sends = new Counter({
      name: 'agentplane_gateway_link_sends_total', help: 'Frames for runners sent to their gateway node, by route (link: the node link; pubsub: no open link)',
      labelNames: ['route'] as const, ...(o.metrics ? { registers: [o.metrics] } : { registers: [] }),
    });
    this.pinger = setInterval(() => this.ping(), PING_EVERY_MS);
    this.pinger.unref();
  }

  /**
   * Send a delivery over the node's link. False when there is none open (the caller publishes):
   * the first call for a node starts opening one. The frame is written at once: a Redis write the
   * node will read when it acts on the frame must already be written to its connection (an
   * explicit pipeline with the turn's held-back writes flushed, as `LeaseRecords.put` does on a
   * single Redis), not held back for the turn's one write.
   */
  send(nodeId: string, d: NodeDelivery): boolean {
    if (this.closed) return false;
    const link = this.links.get(nodeId);
    if (!link?.open || !link.ws || link.ws.readyState !== WebSocket.OPEN) {
      if (!link || (link.retryAt > 0 && Date.now() >= link.retryAt)) this.open(nodeId);
      this.sends.inc({ route: 'pubsub' });
      return false;
    }
    if (link.ws.bufferedAmount > LINK_SEND_BACKLOG_BYTES) {
      this.o.log.warn({ node: nodeId, waiting_bytes: link.ws.bufferedAmount, bound_bytes: LINK_SEND_BACKLOG_BYTES }, 'gateway node is not reading its link; closed, frames go by pub/sub');
      this.cutOff(link);
      this.sends.inc({ route: 'pubsub' });
      return false;
    }
    const text = JSON.stringify({ k: 'd', d } satisfies LinkFrame);
    link.ws.send(text);
    this.sends.inc({ route: 'link' });
    return true;
  }

  /** A link whose node stopped reading: closed at once, tried again after `RETRY_AFTER_MS`. */
  private cutOff(link: Link): void {
    const ws = link.ws;
    link.open = false;
    link.ws = null;
    link.retryAt = Date.now() + RETRY_AFTER_MS;
    ws?.terminate();
  }

  private open(nodeId: string): void {
    if (this.links.size >= MAX_LINKS && !this.links.has(nodeId)) {
      // Forget failed entries first; open links stay.
      for (const [id, l] of this.links) if (!l.open && l.retryAt > 0) this.links.delete(id);
      if (this.links.size >= MAX_LINKS) return;
    }
    const link: Link = { ws: null, open: false, retryAt: 0, alive: true };
    this.links.set(nodeId, link);
    const failed = (why: string) => {
      if (this.links.get(nodeId) !== link) return;
      if (link.open) this.o.log.info({ node: nodeId, why }, 'gateway link closed; frames go by pub/sub until it is open again');
      link.open = false;
      link.ws = null;
      link.retryAt = Date.now() + RETRY_AFTER_MS;
    };
    void (async () => {
      const url = await linkUrlOf(this.o.redis, nodeId);
      if (!url) return failed('the node advertises no link');
      const ticket = randomBytes(24).toString('base64url');
      await this.o.redis.set(ticketKey(secretDigest(ticket)), nodeId, 'PX', TICKET_TTL_MS);
      if (this.closed || this.links.get(nodeId) !== link) return;
      const ws = new WebSocket(`${url}${GATEWAY_LINK_PATH}`, {
        headers: { authorization: `Bearer ${ticket}` }, perMessageDeflate: false, handshakeTimeout: 5_000,
        // Masking guards browsers' traffic through caching proxies; between two platform
        // processes it only costs a pass over every byte: a zero mask skips it.
        generateMask: (mask: Buffer) => void mask.fill(0),
      });
      link.ws = ws;
      ws.on('open', () => {
        if (this.closed || this.links.get(nodeId) !== link) return void ws.close();
        ws.send(JSON.stringify({ k: 'hello', reply_channels: [...this.o.replyChannels] } satisfies LinkFrame));
        link.open = true;
        this.o.log.debug({ node: nodeId }, 'gateway link open');
      });
      ws.on('pong', () => (link.alive = true));
      ws.on('message', (data) => this.onFrame(data.toString()));
      ws.on('error', (err) => failed(err.message));
      ws.on('close', () => failed('closed'));
    })().catch((err: unknown) => failed(err instanceof Error ? err.message : String(err)));
  }

  private onFrame(text: string): void {
    let f: LinkFrame;
    try {
      f = JSON.parse(text) as LinkFrame;
    } catch {
      return;
    }
    if (f.k === 'r' && typeof f.channel === 'string' && typeof f.message === 'string' && this.o.replyChannels.includes(f.channel)) this.o.onReply(f.channel, f.message);
  }

  private ping(): void {
    for (const link of this.links.values()) {
      if (!link.open || !link.ws) continue;
      // No pong since the last ping: the peer is gone without a close.
      if (!link.alive) {
        link.ws.terminate();
        continue;
      }
      link.alive = false;
      link.ws.ping();
    }
  }

  close(): void {
    this.closed = true;
    clearInterval(this.pinger);
    for (const link of this.links.values()) link.ws?.close(1001);
    this.links.clear();
  }
}
