/**
 * Egress for the sandboxes of `network.mode: allowlist` Environments (docs/SANDBOX.md, "Egress
 * allowlist"). The sandbox keeps no network of its own: a relay inside it (Node, started by the
 * driver like any command) listens on 127.0.0.1:3128 and carries each connection made to it over
 * its stdio to the runner. Here the runner reads the connection's HTTP proxy request (`CONNECT
 * host:port`, or a plain-HTTP request in absolute form), lets it through only to a host the
 * Environment lists, resolved by the runner to addresses the egress guard allows (public ones;
 * private ranges only where the runner's operator allows them), and connects it to the very
 * address it checked. The relay is the sandbox's and is not trusted: everything is decided here.
 */
import { lookup as dnsLookup } from 'node:dns/promises';
import { isIP, Socket } from 'node:net';
import { addressAllowed, type Logger } from '@agentplane/core';
import { readClientHello, UNRECOGNIZED_NAME_ALERT } from './tls-hello.js';
import type { SandboxProcess } from './types.js';

/** Where the relay listens inside the sandbox; commands get it as their HTTP(S)_PROXY. */
export const EGRESS_PROXY_PORT = 3128;
export const EGRESS_PROXY_URL = `http://127.0.0.1:${EGRESS_PROXY_PORT}`;

/** The environment every command of an allowlist sandbox gets (the sandbox's own loopback stays direct). */
export const EGRESS_PROXY_ENV: Readonly<Record<string, string>> = Object.freeze({
  HTTP_PROXY: EGRESS_PROXY_URL,
  HTTPS_PROXY: EGRESS_PROXY_URL,
  http_proxy: EGRESS_PROXY_URL,
  https_proxy: EGRESS_PROXY_URL,
  NO_PROXY: 'localhost,127.0.0.1,::1',
  no_proxy: 'localhost,127.0.0.1,::1',
});

/** Frame kinds on the relay's stdio: a 9-byte header (kind, connection id, payload length), then the payload. */
const OPEN = 1;
const DATA = 2;
const END = 3;
const CLOSE = 4;
/** Runner → relay, answered in kind with the same id: the relay still reads and writes. */
const PING = 5;
const HEADER = 9;
/** The relay frames what one socket read gives (at most 64 KiB): a longer frame is a relay not to be read further. */
const MAX_FRAME = 1024 * 1024;
/** What a connection may send while it is being decided (the name resolved, the upstream connected). */
const MAX_PENDING = 1024 * 1024;

/**
 * The relay, run as `node -e`. It trusts nothing it reads from its connections; it only frames
 * bytes. Its one argument is the port (default 3128; 0 for any, in tests). It writes `ready <port>` on stderr once listening and exits when its stdin ends (the runner
 * went away or closed the tunnel). A connection whose socket cannot take more pauses the
 * runner's stream until it drains; the runner's stream that cannot take more pauses every
 * connection's reads.
 */
export const RELAY_SCRIPT = `
const net = require('net');
const out = process.stdout;
const conns = new Map();
let next = 1;
let outFull = false;
function frame(kind, id, data) {
  const h = Buffer.alloc(${HEADER});
  h[0] = kind; h.writeUInt32BE(id, 1); h.writeUInt32BE(data ? data.length : 0, 5);
  if (!out.write(data ? Buffer.concat([h, data]) : h) && !outFull) {
    outFull = true;
    for (const s of conns.values()) s.pause();
  }
}
out.on('drain', () => { outFull = false; for (const s of conns.values()) s.resume(); });
out.on('error', () => process.exit(0));
const server = net.createServer({ allowHalfOpen: true }, (s) => {
  const id = next++;
  conns.set(id, s);
  if (outFull) s.pause();
  frame(${OPEN}, id);
  s.on('data', (d) => frame(${DATA}, id, d));
  s.on('end', () => { if (conns.has(id)) frame(${END}, id); });
  s.on('close', () => { if (conns.delete(id)) frame(${CLOSE}, id); });
  s.on('error', () => {});
});
server.on('error', (e) => { process.stderr.write('egress relay: ' + e.message + '\\n'); process.exit(1); });
server.listen(Number(process.argv[1] || ${EGRESS_PROXY_PORT}), '127.0.0.1', () => process.stderr.write('ready ' + server.address().port + '\\n'));
let buf = Buffer.alloc(0);
process.stdin.on('data', (d) => {
  buf = buf.length ? Buffer.concat([buf, d]) : d;
  while (buf.length >= ${HEADER}) {
    const len = buf.readUInt32BE(5);
    if (buf.length < ${HEADER} + len) break;
    const kind = buf[0], id = buf.readUInt32BE(1), p = buf.subarray(${HEADER}, ${HEADER} + len);
    buf = buf.subarray(${HEADER} + len);
    if (kind === ${PING}) { frame(${PING}, id); continue; }
    const s = conns.get(id);
    if (!s) continue;
    if (kind === ${DATA}) { if (!s.write(p)) { process.stdin.pause(); s.once('drain', () => process.stdin.resume()); } }
    else if (kind === ${END}) s.end();
    else if (kind === ${CLOSE}) { conns.delete(id); s.destroy(); }
  }
});
process.stdin.on('end', () => process.exit(0));
`;

/** One entry of `allowed_hosts`: a host (or `*.` and a domain, for its subdomains) and a port, or any of 80 and 443. */
export interface AllowRule {
  host: string;
  wildcard: boolean;
  port: number | null;
}

/** Reads `host[:port]` as the Environment's schema admits it (lower case; `*.` prefix for subdomains). */
export function parseAllowRule(entry: string): AllowRule {
  const m = /^(\*\.)?(.+?)(?::(\d{1,5}))?$/.exec(entry.trim().toLowerCase());
  if (!m || !m[2]) throw new Error(`not a host[:port]: ${entry}`);
  return { wildcard: m[1] !== undefined, host: m[2].replace(/\.$/, ''), port: m[3] !== undefined ? Number(m[3]) : null };
}

/** A host name as the rules compare it: lower case, without IPv6 brackets or a final dot. */
function normalHost(host: string): string {
  return host.toLowerCase().replace(/^\[|\]$/g, '').replace(/\.$/, '');
}

/** Whether a request to `host:port` is one the rules list. A rule without a port admits 80 and 443 only. */
export function allowedBy(rules: readonly AllowRule[], host: string, port: number): boolean {
  const h = normalHost(host);
  return rules.some((r) => {
    const portOk = r.port === null ? port === 80 || port === 443 : r.port === port;
    if (!portOk) return false;
    return r.wildcard ? h.endsWith(`.${r.host}`) : h === r.host;
  });
}

/** What a connection asked for, read from its HTTP proxy request's head. */
export type ProxyRequest =
  | { kind: 'connect'; host: string; port: number; rest: Buffer }
  | { kind: 'forward'; host: string; port: number; head: Buffer; rest: Buffer }
  | { kind: 'bad'; status: number; reason: string };

const MAX_HEAD = 16 * 1024;
const HOP_HEADERS = new Set(['proxy-connection', 'proxy-authorization', 'connection', 'keep-alive']);

function hostPort(authority: string, defaultPort: number | null): { host: string; port: number } | null {
  let url: URL;
  try {
    url = new URL(`http://${authority}`);
  } catch {
    return null;
  }
  if (url.username || url.password || url.pathname !== '/' || url.search || url.hash) return null;
  const explicit = /:(\d+)$/.exec(authority)?.[1];
  const port = explicit !== undefined ? Number(explicit) : defaultPort;
  if (port === null || !Number.isInteger(port) || port < 1 || port > 65535) return null;
  return { host: url.hostname.replace(/^\[|\]$/g, ''), port };
}

/**
 * Reads a proxy request from the bytes a connection sent so far: undefined while its head is
 * incomplete. A plain-HTTP request is rewritten to origin form and made the connection's only
 * request (`Connection: close`): a second request on it would be checked by nobody. Its Host
 * header is the checked host's, whatever the client wrote.
 */
export function readProxyRequest(bytes: Buffer): ProxyRequest | undefined {
  const end = bytes.indexOf('\r\n\r\n');
  if (end < 0) return bytes.length > MAX_HEAD ? { kind: 'bad', status: 431, reason: 'request head too large' } : undefined;
  if (end > MAX_HEAD) return { kind: 'bad', status: 431, reason: 'request head too large' };
  const lines = bytes.subarray(0, end).toString('latin1').split('\r\n');
  const rest = bytes.subarray(end + 4);
  const m = /^([A-Z]+) (\S+) (HTTP\/1\.[01])$/.exec(lines[0] ?? '');
  if (!m) return { kind: 'bad', status: 400, reason: 'not an HTTP/1.x proxy request' };
  const [, method, target, version] = m as unknown as [string, string, string, string];
  if (method === 'CONNECT') {
    const hp = hostPort(target, null);
    if (!hp) return { kind: 'bad', status: 400, reason: 'CONNECT needs host:port' };
    return { kind: 'connect', ...hp, rest };
  }
  if (!target.startsWith('http://')) {
    return { kind: 'bad', status: 400, reason: 'only CONNECT (for https) and absolute http:// requests go through this proxy' };
  }
  let url: URL;
  try {
    url = new URL(target);
  } catch {
    return { kind: 'bad', status: 400, reason: 'not a URL' };
  }
  const hp = hostPort(url.host, 80);
  if (!hp) return { kind: 'bad', status: 400, reason: 'not a host and port' };
  // The Host header names the host that was checked: another name would reach another site
  // served from the same address (a shared CDN), past the list.
  const headers = lines.slice(1).filter((l) => {
    const name = l.slice(0, l.indexOf(':')).trim().toLowerCase();
    return !HOP_HEADERS.has(name) && name !== 'host';
  });
  headers.unshift(`Host: ${url.host}`);
  const head = Buffer.from([`${method} ${url.pathname}${url.search} ${version}`, ...headers, 'Connection: close', '', ''].join('\r\n'), 'latin1');
  return { kind: 'forward', ...hp, head, rest };
}

export interface EgressDecision {
  host: string;
  port: number;
  /** `connected`: allowed and connected; `refused`: not allowed here; `failed`: allowed, and the connection could not be made. */
  outcome: 'connected' | 'refused' | 'failed';
  /** Why it was refused or failed. */
  reason?: string;
}

export interface EgressTunnelOptions {
  /** Let connections reach private and reserved ranges, loopback included (the runner's operator allows it). */
  allowPrivate: boolean;
  log: Logger;
  /** Each connection's decision (metrics). */
  onDecision?: (decision: EgressDecision) => void;
  /** Resolver (tests): every address a name has. */
  lookup?: (host: string) => Promise<Array<{ address: string; family: number }>>;
  connectTimeoutMs?: number;
  /** Connections open at once through one sandbox's relay. Default 256. */
  maxConnections?: number;
}

interface Conn {
  id: number;
  /**
   * `head`: reading the request head; `deciding`: checking and connecting; `hello`: a `CONNECT`'s
   * tunnel is up and the sandbox's first bytes are read (a TLS ClientHello's server name is
   * checked) before any goes upstream; `open`: bytes flow; `closed`.
   */
  state: 'head' | 'deciding' | 'hello' | 'open' | 'closed';
  /** Bytes of the request head read so far; in `hello`, the sandbox's first bytes read so far. */
  head: Buffer;
  upstream: Socket | undefined;
  /** Bytes the sandbox sent after the head while the connection was being decided. */
  pending: Buffer[];
  pendingBytes: number;
  sandboxEnded: boolean;
  /** What the connection asked for, once its head is read. */
  target: { host: string; port: number } | undefined;
  /** The address it was connected to, once chosen. */
  address: string | undefined;
  /** Its outcome was reported (once per connection). */
  settled: boolean;
}

const STATUS_TEXT: Record<number, string> = { 400: 'Bad Request', 403: 'Forbidden', 431: 'Request Header Fields Too Large', 502: 'Bad Gateway', 503: 'Service Unavailable', 504: 'Gateway Timeout' };

/** The proxy's own answer: a status and a one-line reason, the connection closing after it. */
function reply(status: number, body: string): Buffer {
  const text = `agentplane egress: ${body}\n`;
  return Buffer.from(`HTTP/1.1 ${status} ${STATUS_TEXT[status] ?? 'Error'}\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: ${Buffer.byteLength(text)}\r\nConnection: close\r\n\r\n${text}`);
}

/**
 * The runner's end of one sandbox's relay: decides and connects the relay's connections. The
 * relay process ending (the container stopped, the agent killed it) ends the tunnel: `alive`
 * turns false and the driver starts a new relay before the next command.
 */
export class EgressTunnel {
  private rules: AllowRule[];
  private readonly conns = new Map<number, Conn>();
  private inbound: Buffer = Buffer.alloc(0);
  private ended = false;
  /** Upstreams waiting to drain (the relay's stream is paused while any is). */
  private held = 0;
  /** How often the relay was held for a slow upstream, and the most bytes an upstream socket had waiting. */
  readonly stats = { holds: 0, maxUpstreamBuffered: 0 };
  private nextPing = 0;
  private readonly pings = new Map<number, () => void>();
  private readonly lookup: (host: string) => Promise<Array<{ address: string; family: number }>>;

  constructor(private readonly relay: SandboxProcess, allowedHosts: readonly string[], private readonly o: EgressTunnelOptions) {
    this.rules = allowedHosts.map(parseAllowRule);
    this.lookup = o.lookup ?? ((host) => dnsLookup(host, { all: true, verbatim: true }));
    relay.stdout.on('data', (d: Buffer) => this.onRelayData(d));
    relay.stdin.on('drain', () => {
      for (const c of this.conns.values()) c.upstream?.resume();
    });
    relay.stdin.on('error', () => this.shut());
    void relay.wait().then(() => this.shut());
  }

  get alive(): boolean {
    return !this.ended;
  }

  /**
   * Whether the relay answers: its process may be gone before its end shows here (killed by the
   * agent a moment ago). A relay held for a slow upstream is busy, not gone.
   */
  async ping(timeoutMs: number): Promise<boolean> {
    if (this.ended) return false;
    if (this.held > 0) return true;
    const id = (this.nextPing = (this.nextPing + 1) >>> 0);
    let timer: NodeJS.Timeout | undefined;
    try {
      return await Promise.race([
        new Promise<boolean>((resolve) => {
          this.pings.set(id, () => resolve(true));
          this.send(PING, id);
        }),
        new Promise<boolean>((resolve) => {
          timer = setTimeout(() => resolve(false), timeoutMs);
        }),
      ]);
    } finally {
      clearTimeout(timer);
      this.pings.delete(id);
    }
  }

  /** The Environment's list as the latest Run has it (a Session's sandbox is reused between Runs). */
  setAllowed(allowedHosts: readonly string[]): void {
    this.rules = allowedHosts.map(parseAllowRule);
  }

  /** Ends every connection and the relay. */
  async close(): Promise<void> {
    this.shut();
    await this.relay.kill().catch(() => undefined);
  }

  private shut(): void {
    if (this.ended) return;
    this.ended = true;
    for (const c of this.conns.values()) {
      c.state = 'closed';
      c.upstream?.destroy();
    }
    this.conns.clear();
  }

  private send(kind: number, id: number, data?: Buffer): void {
    if (this.ended) return;
    const h = Buffer.alloc(HEADER);
    h[0] = kind;
    h.writeUInt32BE(id, 1);
    h.writeUInt32BE(data ? data.length : 0, 5);
    if (!this.relay.stdin.write(data ? Buffer.concat([h, data]) : h)) {
      // The sandbox reads slower than upstreams send: hold every upstream until it drains.
      for (const c of this.conns.values()) c.upstream?.pause();
    }
  }

  private onRelayData(d: Buffer): void {
    if (this.ended) return;
    this.inbound = this.inbound.length ? Buffer.concat([this.inbound, d]) : d;
    while (this.inbound.length >= HEADER) {
      const len = this.inbound.readUInt32BE(5);
      if (len > MAX_FRAME) {
        // Not what the relay writes: whatever sent it is not read any further.
        this.o.log.warn({ len }, 'the sandbox\'s egress relay sent a malformed frame: closing its tunnel');
        void this.close();
        return;
      }
      if (this.inbound.length < HEADER + len) break;
      const kind = this.inbound[0] ?? 0;
      const id = this.inbound.readUInt32BE(1);
      const payload = this.inbound.subarray(HEADER, HEADER + len);
      this.inbound = this.inbound.subarray(HEADER + len);
      this.onFrame(kind, id, payload);
    }
  }

  private onFrame(kind: number, id: number, payload: Buffer): void {
    if (kind === PING) {
      this.pings.get(id)?.();
      return;
    }
    if (kind === OPEN) {
      if (this.conns.size >= (this.o.maxConnections ?? 256)) {
        this.answer(id, 503, 'too many connections open through this sandbox\'s proxy');
        return;
      }
      this.conns.set(id, { id, state: 'head', head: Buffer.alloc(0), upstream: undefined, pending: [], pendingBytes: 0, sandboxEnded: false, target: undefined, address: undefined, settled: false });
      return;
    }
    const c = this.conns.get(id);
    if (!c) return;
    if (kind === DATA) {
      if (c.state === 'head') {
        c.head = Buffer.concat([c.head, payload]);
        const req = readProxyRequest(c.head);
        if (req) {
          c.state = 'deciding';
          c.head = Buffer.alloc(0);
          void this.decide(c, req);
        }
      } else if (c.state === 'open' && c.upstream) {
        this.toUpstream(c.upstream, payload);
      } else if (c.state === 'hello') {
        c.head = c.head.length ? Buffer.concat([c.head, payload]) : payload;
        this.checkHello(c);
      } else if (c.state === 'deciding') {
        c.pending.push(payload);
        c.pendingBytes += payload.length;
        if (c.pendingBytes > MAX_PENDING) this.finish(c, 400, 'more than 1 MiB sent before the connection was made');
      }
    } else if (kind === END) {
      c.sandboxEnded = true;
      if (c.state === 'open') c.upstream?.end();
      else if (c.state === 'hello') this.checkHello(c);
      else if (c.state === 'head') this.finish(c, 400, 'the connection ended before its request head');
    } else if (kind === CLOSE) {
      if (c.state === 'hello') this.settle(c, 'connected');
      c.state = 'closed';
      this.conns.delete(id);
      c.upstream?.destroy();
    }
  }

  private toUpstream(upstream: Socket, bytes: Buffer): void {
    const ok = upstream.write(bytes);
    this.stats.maxUpstreamBuffered = Math.max(this.stats.maxUpstreamBuffered, upstream.writableLength);
    if (!ok) this.holdRelay(upstream);
  }

  /** Reports a connection's outcome, once. */
  private settle(c: Conn, outcome: EgressDecision['outcome'], reason?: string): void {
    if (c.settled || !c.target) return;
    c.settled = true;
    const { host, port } = c.target;
    this.o.onDecision?.({ host, port, outcome, ...(reason !== undefined ? { reason } : {}) });
    if (outcome === 'connected') this.o.log.info({ host, port, address: c.address }, 'sandbox egress connected');
    else this.o.log.warn({ host, port, outcome, reason }, 'sandbox egress not connected');
  }

  /**
   * A `CONNECT` tunnel's first bytes from the sandbox, before any goes upstream. A TLS ClientHello
   * must name the host the `CONNECT` named, or none: another name would reach another site served
   * from the checked address (a shared CDN), past the list. A protocol that is not TLS goes through
   * as it is (its host and port were checked).
   */
  private checkHello(c: Conn): void {
    const upstream = c.upstream;
    if (c.state !== 'hello' || !upstream || !c.target) return;
    if (c.head.length === 0 && !c.sandboxEnded) return;
    const read = c.head.length === 0 ? { kind: 'not_tls' as const } : readClientHello(c.head);
    if (read.kind === 'incomplete' && !c.sandboxEnded) return;
    const refused = read.kind === 'incomplete' ? 'the connection ended inside its TLS ClientHello'
      : read.kind === 'bad' ? `its TLS ClientHello is malformed (${read.reason})`
      : read.kind === 'hello' && read.serverName !== null && normalHost(read.serverName) !== normalHost(c.target.host) ? `its TLS server name ${read.serverName} is not the host it asked to CONNECT to`
      : undefined;
    if (refused !== undefined) {
      this.settle(c, 'refused', refused);
      // What a server says to a name it does not serve: the client's TLS error names it.
      this.send(DATA, c.id, UNRECOGNIZED_NAME_ALERT);
      this.send(END, c.id);
      c.state = 'closed';
      this.conns.delete(c.id);
      upstream.destroy();
      return;
    }
    c.state = 'open';
    this.settle(c, 'connected');
    const first = c.head;
    c.head = Buffer.alloc(0);
    if (first.length > 0) this.toUpstream(upstream, first);
    if (c.sandboxEnded) upstream.end();
  }

  /**
   * An upstream that takes bytes slower than the sandbox sends them holds the relay's stream (every
   * connection's sends) until it drains: the runner buffers no more than the streams' own windows.
   */
  private holdRelay(upstream: Socket): void {
    this.held += 1;
    this.stats.holds += 1;
    this.relay.stdout.pause();
    const release = (): void => {
      upstream.off('drain', release);
      upstream.off('close', release);
      this.held -= 1;
      if (this.held === 0 && !this.ended) this.relay.stdout.resume();
    };
    upstream.on('drain', release);
    upstream.on('close', release);
  }

  /** Writes the proxy's answer on a relay connection and ends it (ended, not destroyed: see `finish`). */
  private answer(id: number, status: number, body: string): void {
    this.send(DATA, id, reply(status, body));
    this.send(END, id);
  }

  /**
   * Answers the sandbox with an error and ends the connection. The relay's socket is ended, not
   * destroyed: a client still sending (an upload refused before it was read) reads the answer
   * instead of a reset. What it sends after is not read here.
   */
  private finish(c: Conn, status: number, body: string): void {
    if (c.state === 'closed') return;
    this.answer(c.id, status, body);
    c.state = 'closed';
    this.conns.delete(c.id);
    c.upstream?.destroy();
  }

  private async decide(c: Conn, req: ProxyRequest): Promise<void> {
    if (req.kind === 'bad') return this.finish(c, req.status, req.reason);
    const target = `${req.host}:${req.port}`;
    c.target = { host: req.host, port: req.port };
    const notConnected = (outcome: 'refused' | 'failed', status: number, reason: string): void => {
      this.settle(c, outcome, reason);
      this.finish(c, status, `${target}: ${reason}`);
    };
    if (!allowedBy(this.rules, req.host, req.port)) return notConnected('refused', 403, 'not in the Environment\'s allowed_hosts');
    let address: string;
    try {
      const literal = isIP(req.host) !== 0;
      const addrs = literal ? [{ address: req.host, family: isIP(req.host) }] : await this.lookup(req.host);
      if (addrs.length === 0) return notConnected('failed', 502, 'the name has no address');
      // Every address must pass: a name that also resolves to a private address is refused outright.
      const policy = { development: false, allowPrivate: this.o.allowPrivate };
      if (addrs.some((a) => !addressAllowed(a.address, policy))) return notConnected('refused', 403, 'it resolves to a private or reserved address, which this runner does not allow');
      // IPv4 first where the name has both: a runner without an IPv6 route would fail otherwise.
      address = (addrs.find((a) => a.family === 4) ?? addrs[0]!).address;
    } catch (err) {
      return notConnected('failed', 502, `the name did not resolve (${(err as NodeJS.ErrnoException).code ?? (err as Error).message})`);
    }
    if (c.state !== 'deciding') return;
    c.address = address;
    const upstream = new Socket({ allowHalfOpen: true });
    c.upstream = upstream;
    let connected = false;
    const timer = setTimeout(() => upstream.destroy(Object.assign(new Error('connect timed out'), { code: 'ETIMEDOUT' })), this.o.connectTimeoutMs ?? 10_000);
    upstream.once('connect', () => {
      clearTimeout(timer);
      connected = true;
      if (c.state !== 'deciding') return void upstream.destroy();
      // What the upstream sends flows from now on (a protocol whose server speaks first included).
      upstream.on('data', (d: Buffer) => this.send(DATA, c.id, d));
      upstream.on('end', () => {
        if (c.state === 'open' || c.state === 'hello') this.send(END, c.id);
      });
      const rest = c.pending.length > 0 ? Buffer.concat([req.rest, ...c.pending.splice(0)]) : req.rest;
      c.pendingBytes = 0;
      if (req.kind === 'connect') {
        this.send(DATA, c.id, Buffer.from('HTTP/1.1 200 Connection Established\r\n\r\n'));
        c.state = 'hello';
        c.head = rest;
        this.checkHello(c);
        return;
      }
      c.state = 'open';
      this.settle(c, 'connected');
      upstream.write(req.head);
      if (rest.length > 0) upstream.write(rest);
      if (upstream.writableNeedDrain) this.holdRelay(upstream);
      if (c.sandboxEnded) upstream.end();
    });
    upstream.on('error', (err: NodeJS.ErrnoException) => {
      clearTimeout(timer);
      if (!connected && c.state === 'deciding') notConnected('failed', err.code === 'ETIMEDOUT' ? 504 : 502, `connecting failed (${err.code ?? err.message})`);
    });
    upstream.on('close', () => {
      clearTimeout(timer);
      if (c.state === 'hello') this.settle(c, 'connected');
      if (c.state === 'closed') return;
      c.state = 'closed';
      this.conns.delete(c.id);
      this.send(CLOSE, c.id);
    });
    upstream.connect({ host: address, port: req.port });
  }
}

/** A relay that ended before it was ready: its exit code and the tail of what it wrote. */
export class RelayEnded extends Error {
  constructor(readonly exitCode: number, readonly output: string) {
    super(`the egress relay ended (exit ${exitCode})${output ? `: ${output}` : ''}`);
    this.name = 'RelayEnded';
  }

  /** The image has no `node` to run the relay on (the shell's "command not found"): the Environment's fault, not the machine's. */
  get nodeMissing(): boolean {
    return this.exitCode === 127 && /node/.test(this.output);
  }
}

/**
 * Waits for a relay's `ready <port>` (its port), at most `timeoutMs`. A relay that ends first
 * (no `node` in the image, the port taken: a {@link RelayEnded}) or does not answer in time is
 * killed and the error names what it wrote.
 */
export async function relayReady(relay: SandboxProcess, timeoutMs: number): Promise<number> {
  let text = '';
  let timer: NodeJS.Timeout | undefined;
  let onData: ((d: Buffer) => void) | undefined;
  try {
    return await new Promise<number>((resolve, reject) => {
      onData = (d: Buffer) => {
        text = (text + d.toString('utf8')).slice(-2048);
        const m = /(?:^|\n)ready (\d+)\n/.exec(text);
        if (m) resolve(Number(m[1]));
      };
      relay.stderr.on('data', onData);
      void relay.wait().then(({ exitCode }) => reject(new RelayEnded(exitCode, text.trim())));
      timer = setTimeout(() => reject(new Error(`the egress relay did not start within ${timeoutMs} ms`)), timeoutMs);
    });
  } catch (err) {
    await relay.kill().catch(() => undefined);
    throw err;
  } finally {
    clearTimeout(timer);
    if (onData) relay.stderr.off('data', onData);
    // The relay's later stderr is not read: keep it flowing.
    relay.stderr.resume();
  }
}
