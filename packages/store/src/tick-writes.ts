import type { Socket } from 'node:net';
import type { Cluster, Redis } from 'ioredis';

/**
 * One socket write per turn of the event loop for a client's commands, with no limit on the
 * batches in flight.
 *
 * Under load many requests' commands are issued in the same turn (their Redis answers or their
 * HTTP bodies arrived together); one write instead of one per command saves a system call each,
 * and on loopback the sender's write also runs the receiving side's network path. ioredis's own
 * auto-pipelining gets that saving, but keeps one batch in flight per connection: commands issued
 * while a batch is out wait for its answer before they are written, so every request waits on
 * the requests before it (alternating runs of `bench:dispatch` at 200 Runs/s read a lease p50 of
 * 10–76 ms with it and 8–25 ms with this, lower in every pair: docs/RUNS.md), and it builds a
 * pipeline, a callback and a deferred answer per command on top of the command itself.
 *
 * Here the first command a client writes in a turn corks its socket and the turn's check phase
 * (`setImmediate`, run after the I/O callbacks of the turn, as ioredis's auto-pipeline does)
 * uncorks it: Node writes everything corked meanwhile in one `writev`. Commands go out in the
 * order they were issued and are answered as ioredis always answers them. A command written
 * while the client is not ready (the handshake, the offline queue's replay) is written at once,
 * as before.
 *
 * A write that another process must find before it acts on a message sent over another socket
 * (a frame to a gateway node, whose handler then reads Redis) is pushed out first with
 * `flushTickWrites()`.
 *
 * Other sockets take the same turn's hold with `corkForTurn` (the gateway's runner sockets and
 * node links: the frames of one turn to one peer leave in one write).
 */

const TICK_WRITES: unique symbol = Symbol.for('agentplane.tickWrites');

type SendCommand = Redis['sendCommand'];

interface Coalesced {
  [TICK_WRITES]?: true;
  sendCommand: SendCommand;
  stream?: Socket;
  status: string;
}

/** A writable stream whose writes can be held (a `net.Socket`, an upgraded HTTP connection). */
export interface Corkable {
  cork(): void;
  uncork(): void;
  readonly writable: boolean;
}

/** Sockets corked in this turn, uncorked at its check phase or by `flushTickWrites`. */
const corked = new Set<Corkable>();
let scheduled = false;

function release(): void {
  scheduled = false;
  // Each socket was corked once this turn: one `uncork` undoes that and nothing anyone else did.
  for (const socket of corked) socket.uncork();
  corked.clear();
}

/** Writes everything held back in the current turn (coalescing clients' commands, `corkForTurn`'s sockets), now. */
export function flushTickWrites(): void {
  if (corked.size > 0) release();
}

/**
 * Holds `socket`'s writes until the end of the current turn (its check phase) or
 * `flushTickWrites()`, when they leave in one write. Call it before each write of the turn;
 * calls after the first are free.
 */
export function corkForTurn(socket: Corkable): void {
  if (corked.has(socket) || !socket.writable) return;
  socket.cork();
  corked.add(socket);
  if (!scheduled) {
    scheduled = true;
    setImmediate(release);
  }
}

/** Makes `client` (a single-server client, or each node client of a cluster) coalesce its writes per turn. Returns it. */
export function coalesceTickWrites<T extends Redis | Cluster>(client: T): T {
  const c = client as unknown as Coalesced & { isCluster?: boolean; on(event: '+node', fn: (node: Redis) => void): unknown; nodes(role: 'all'): Redis[] };
  if (c.isCluster === true) {
    // Node clients are made as the cluster's topology is learned (and again after a failover),
    // the first ones after the constructor returns (it resolves the seed nodes asynchronously);
    // any made before this call are taken as they are.
    c.on('+node', (node) => coalesceTickWrites(node));
    for (const node of c.nodes('all')) coalesceTickWrites(node);
    return client;
  }
  if (c[TICK_WRITES]) return client;
  c[TICK_WRITES] = true;
  const send = c.sendCommand;
  c.sendCommand = function sendCoalesced(this: Coalesced, command, stream) {
    // `stream` is set by an explicit pipeline, which writes its commands in one piece itself.
    if (stream === undefined && this.status === 'ready' && this.stream !== undefined) corkForTurn(this.stream);
    return send.call(this, command, stream);
  } as SendCommand;
  return client;
}
