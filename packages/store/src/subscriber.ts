import type { Redis } from 'ioredis';
import { isCluster } from './redis.js';

/** What is used of ioredis's cluster subscriber (the holder of a Cluster client's subscriptions). */
interface ClusterSubscriberLike {
  getInstance(): SubscriberConnection | null;
}
interface SubscriberConnection {
  readonly status: string;
  once(event: 'end' | 'ready', listener: () => void): unknown;
}

/**
 * Calls `replaced` each time the connection that carries `sub`'s subscriptions is replaced after
 * the first one: on one Redis when the client is ready again after a reconnect; on a Redis
 * Cluster also when the client moves its subscriptions to another node because theirs went away
 * (ioredis's ClusterSubscriber re-subscribes on the new node and emits nothing on the client).
 * Either way, what was published in between was lost: `replaced` re-subscribes (its confirmation
 * then covers the client's own re-subscription, replies coming in order) and re-reads what it may
 * have missed. On a cluster it is called once the new connection is ready: a subscription sent
 * while the connection still runs its ready check breaks that check.
 */
export function onSubscriberReplaced(sub: Redis, replaced: () => void): void {
  let everReady = false;
  sub.on('ready', () => {
    if (!everReady) {
      everReady = true;
      return;
    }
    replaced();
  });
  const holder = (sub as unknown as { subscriber?: unknown }).subscriber;
  if (!isCluster(sub) || !holder || typeof (holder as ClusterSubscriberLike).getInstance !== 'function') return;
  const cs = holder as ClusterSubscriberLike;
  let current: SubscriberConnection | null = null;
  let seen = false;
  const check = () => {
    const next = cs.getInstance();
    if (next === current) return;
    current = next;
    if (!next) return;
    next.once('end', () => setImmediate(check));
    // The first connection is the one the subscriptions were made on.
    if (!seen) {
      seen = true;
      return;
    }
    const ready = () => {
      if (current === next) replaced();
    };
    if (next.status === 'ready') ready();
    else next.once('ready', ready);
  };
  sub.on('ready', check);
  sub.on('+node', check);
  sub.on('refresh', check);
  check();
}
