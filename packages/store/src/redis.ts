import { ConfigError } from '@agentplane/core';
import { Cluster, Redis, type ClusterNode, type ClusterOptions, type RedisOptions } from 'ioredis';
import { installLeanPipelines } from './lean-pipeline.js';
import { coalesceTickWrites } from './tick-writes.js';

// Every ioredis pipeline of this process (ours, BullMQ's) without the
// per-instance accessor that kept it alive until a full collection (lean-pipeline.ts).
installLeanPipelines();

export type { Redis };

export interface RedisConnectOptions {
  /** Connection name shown by CLIENT LIST, e.g. `api`, `scheduler:bullmq`. */
  name: string;
  /**
   * BullMQ's blocking connections need `null` (never give up on a command);
   * request-path connections fail fast so that an outage becomes a 503, not a hang.
   */
  blocking?: boolean;
}

/**
 * `REDIS_URL` names either one Redis (`redis://[user:password@]host:port[/db]`, `rediss://` for
 * TLS) or a Redis Cluster by a seed list of its nodes:
 *
 *   redis+cluster://[user:password@]host1:port1,host2:port2,...   (rediss+cluster:// for TLS)
 *
 * Any reachable subset of the nodes will do (the client discovers the rest from CLUSTER SLOTS);
 * list at least one node per master so that a start with one node down still finds the cluster.
 * The credential applies to every node. A database number is refused: Redis Cluster has only 0.
 *
 * A Redis on the same machine may be named by its Unix socket instead:
 *
 *   unix:///path/to/redis.sock[?password=…&username=…&db=N]
 *
 * A local socket costs each command about half the CPU of loopback TCP, on both sides (no TCP
 * stack in between); the embedded Redis is reached this way.
 */
export interface RedisTarget {
  cluster: boolean;
  nodes: { host: string; port: number }[];
  /** A Redis on this machine reached by its Unix socket (`unix:///path/redis.sock`): no nodes. */
  path?: string;
  username?: string;
  password?: string;
  tls: boolean;
  db?: number;
}

const CLUSTER_SCHEMES: Record<string, boolean> = { 'redis+cluster:': false, 'rediss+cluster:': true };

export function isClusterUrl(url: string): boolean {
  return /^rediss?\+cluster:\/\//i.test(url.trim());
}

export function isUnixSocketUrl(url: string): boolean {
  return /^unix:\/\//i.test(url.trim());
}

/** Parse a `REDIS_URL` (single or cluster form). Throws a ConfigError naming what is wrong (never the URL: it may hold a password). */
export function parseRedisUrl(url: string): RedisTarget {
  const raw = url.trim();
  const scheme = /^([a-z+]+:)\/\//i.exec(raw)?.[1]?.toLowerCase();
  if (scheme && scheme in CLUSTER_SCHEMES) {
    const rest = raw.slice(scheme.length + 2);
    const at = rest.lastIndexOf('@');
    const auth = at >= 0 ? rest.slice(0, at) : '';
    const hostPart = rest.slice(at + 1).replace(/\/+$/, '');
    if (hostPart.includes('/')) throw new ConfigError('REDIS_URL: a Redis Cluster has no database number (redis+cluster://host:port,host:port)');
    const nodes = hostPart.split(',').map((s) => s.trim()).filter(Boolean).map((hp) => {
      const m = /^(\[[^\]]+\]|[^:]+):(\d{1,5})$/.exec(hp);
      if (!m) throw new ConfigError(`REDIS_URL: '${hp}' is not host:port`);
      return { host: m[1]!.replace(/^\[|\]$/g, ''), port: Number(m[2]) };
    });
    if (nodes.length === 0) throw new ConfigError('REDIS_URL: a cluster URL needs at least one host:port');
    const colon = auth.indexOf(':');
    const username = colon >= 0 ? decodeURIComponent(auth.slice(0, colon)) : '';
    const password = colon >= 0 ? decodeURIComponent(auth.slice(colon + 1)) : decodeURIComponent(auth);
    return { cluster: true, nodes, tls: CLUSTER_SCHEMES[scheme]!, ...(username ? { username } : {}), ...(password ? { password } : {}) };
  }
  if (isUnixSocketUrl(raw)) return unixTarget(raw);
  const u = urlOf(raw);
  if (u.protocol !== 'redis:' && u.protocol !== 'rediss:') throw new ConfigError(`REDIS_URL: unknown scheme '${u.protocol}' (redis:, rediss:, unix:, redis+cluster:, rediss+cluster:)`);
  if (u.hostname === '') throw new ConfigError('REDIS_URL: no host (redis://[:password@]host:port)');
  const db = u.pathname.replace(/^\//, '');
  if (db !== '' && !/^\d{1,5}$/.test(db)) throw new ConfigError('REDIS_URL: the path is a database number (redis://host:port/0)');
  return {
    cluster: false,
    nodes: [{ host: u.hostname.replace(/^\[|\]$/g, ''), port: Number(u.port || 6379) }],
    tls: u.protocol === 'rediss:',
    ...(u.username ? { username: decodeURIComponent(u.username) } : {}),
    ...(u.password ? { password: decodeURIComponent(u.password) } : {}),
    ...(db ? { db: Number(db) } : {}),
  };
}

function urlOf(raw: string): URL {
  try {
    return new URL(raw);
  } catch {
    throw new ConfigError('REDIS_URL is not a URL: redis://[:password@]host:port, unix:///path/to/redis.sock or redis+cluster://host:port,host:port');
  }
}

/** A `REDIS_URL` setting checked as a process reads its settings (a ConfigError at start, not a crash at the first connect), kept as written. */
export function checkedRedisUrl(url: string): string {
  parseRedisUrl(url);
  return url;
}

function unixTarget(raw: string): RedisTarget {
  const u = urlOf(raw);
  if (u.host !== '') throw new ConfigError('REDIS_URL: a Unix socket URL has no host (unix:///path/to/redis.sock)');
  const path = decodeURIComponent(u.pathname);
  if (!path.startsWith('/') || path.length < 2) throw new ConfigError('REDIS_URL: a Unix socket URL needs an absolute path (unix:///path/to/redis.sock)');
  for (const key of u.searchParams.keys()) {
    if (!['password', 'username', 'db'].includes(key)) throw new ConfigError(`REDIS_URL: unknown parameter '${key}' (password, username, db)`);
  }
  const db = u.searchParams.get('db');
  if (db !== null && !/^\d{1,5}$/.test(db)) throw new ConfigError('REDIS_URL: db is a database number');
  const username = u.searchParams.get('username');
  const password = u.searchParams.get('password');
  return {
    cluster: false, nodes: [], path, tls: false,
    ...(username ? { username } : {}), ...(password ? { password } : {}), ...(db !== null ? { db: Number(db) } : {}),
  };
}

/** The URL of a Redis reached by its Unix socket (see parseRedisUrl). */
export function unixSocketUrl(path: string, password?: string): string {
  return `unix://${encodeURI(path).replace(/[?#]/g, encodeURIComponent)}${password ? `?password=${encodeURIComponent(password)}` : ''}`;
}

/** The client, its writes coalesced per turn, as are those of every client duplicated from it. */
function coalescing(client: Redis): Redis {
  coalesceTickWrites(client);
  const original = client.duplicate.bind(client);
  Object.defineProperty(client, 'duplicate', {
    configurable: true,
    writable: true,
    value: (override?: Partial<RedisOptions>): Redis => coalescing(original(override)),
  });
  return client;
}

function clusterClient(target: RedisTarget, redisOptions: RedisOptions, options: Omit<ClusterOptions, 'redisOptions'>): Cluster {
  const nodes: ClusterNode[] = target.nodes.map((n) => ({ host: n.host, port: n.port }));
  const cluster = new Cluster(nodes, {
    ...options,
    redisOptions: {
      ...redisOptions,
      ...(target.username ? { username: target.username } : {}),
      ...(target.password ? { password: target.password } : {}),
      ...(target.tls ? { tls: {} } : {}),
    },
  });
  // Callers written for one Redis duplicate with Redis options (`duplicate({connectionName})`);
  // BullMQ duplicates a Cluster the Cluster way (`duplicate(nodes?, {redisOptions})`). Serve both.
  const original = cluster.duplicate.bind(cluster);
  Object.defineProperty(cluster, 'duplicate', {
    configurable: true,
    writable: true,
    value: (first?: ClusterNode[] | RedisOptions, second?: ClusterOptions): Cluster => {
      if (first === undefined || Array.isArray(first)) return coalesceTickWrites(original(first, second));
      const { maxRetriesPerRequest, ...rest } = first;
      return clusterClient(target, { ...redisOptions, ...rest, ...(maxRetriesPerRequest !== undefined ? { maxRetriesPerRequest } : {}) }, options);
    },
  });
  return coalesceTickWrites(cluster);
}

/**
 * A client of one Redis named by either single-server form (`redis://`, `rediss://`, `unix://`)
 * with exactly `options` (none of the platform's defaults): for tools and benches that need a
 * plain connection to the same server the platform uses.
 */
export function singleRedis(url: string, options: RedisOptions = {}): Redis {
  if (!isUnixSocketUrl(url)) return new Redis(url, options);
  const { path, username, password, db } = parseRedisUrl(url);
  return new Redis({ ...options, path, ...(username ? { username } : {}), ...(password ? { password } : {}), ...(db !== undefined ? { db } : {}) });
}

/**
 * One place that turns REDIS_URL into an ioredis client with the platform's defaults. For a
 * cluster URL the client is an ioredis `Cluster`: it speaks the same commands (every multi-key
 * command and script of the platform stays inside one hash tag, so inside one slot) and is typed
 * as `Redis` so that stores need not care which one they hold.
 */
export function connectRedis(url: string, options: RedisConnectOptions): Redis {
  const retryStrategy = (times: number): number => Math.min(50 * 2 ** Math.min(times, 6), 2000);
  const base: RedisOptions = {
    connectionName: `agentplane:${options.name}`,
    lazyConnect: false,
    retryStrategy,
    maxRetriesPerRequest: options.blocking ? null : 3,
    enableOfflineQueue: true,
  };
  // Commands issued in the same turn of the event loop (many requests' lookups under load) share
  // one socket write, and a batch does not wait for the one before it (tick-writes.ts); the
  // connections BullMQ and the stores duplicate from this one do the same.
  if (!isClusterUrl(url)) return coalescing(singleRedis(url, base));
  const target = parseRedisUrl(url);
  const cluster = clusterClient(target, base, {
    enableOfflineQueue: true,
    clusterRetryStrategy: retryStrategy,
    // A failover moves slots: retry MOVED/TRYAGAIN/CLUSTERDOWN for a few seconds instead of failing.
    retryDelayOnFailover: 200,
    retryDelayOnClusterDown: 300,
    retryDelayOnTryAgain: 200,
    retryDelayOnMoved: 0,
    maxRedirections: 32,
    slotsRefreshTimeout: 2000,
    // Keep the slot map current on its own too (a replica promoted while this client was idle).
    slotsRefreshInterval: 5000,
  });
  return cluster as unknown as Redis;
}

/** Is this client a Redis Cluster client? */
export function isCluster(redis: Redis): boolean {
  return (redis as unknown as { isCluster?: boolean }).isCluster === true;
}

/** Wait until PING answers (or give up after `timeoutMs`). */
export async function waitForRedis(redis: Redis, timeoutMs = 10_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    try {
      await redis.ping();
      return;
    } catch (err) {
      if (Date.now() > deadline) throw err;
      await new Promise((r) => setTimeout(r, 100));
    }
  }
}

/**
 * GET of keys that may live in different hash tags (so different slots): one MGET on a single
 * Redis would be refused with CROSSSLOT on a cluster. The GETs share one socket write anyway
 * (tick-writes.ts), so this costs no extra round trip.
 */
export function getEach(redis: Redis, keyList: readonly string[]): Promise<(string | null)[]> {
  return Promise.all(keyList.map((k) => redis.get(k)));
}
