import type { Socket } from 'node:net';
import { afterAll, describe, expect, it } from 'vitest';
import { useEmbeddedRedis } from './testing.js';
import { Redis } from 'ioredis';
import { connectRedis } from './redis.js';
import { flushTickWrites } from './tick-writes.js';

const clients: Redis[] = [];

const testRedis = useEmbeddedRedis('tick-writes-test');

afterAll(async () => {
  for (const c of clients) c.disconnect();
});

async function ready(name: string): Promise<Redis> {
  const redis = connectRedis(testRedis.server().url, { name });
  clients.push(redis);
  await redis.ping();
  return redis;
}

/** Counts the writes that reach the socket (one per `write` when uncorked, one `writev` per uncork). */
function countWrites(redis: Redis): { writes: () => number } {
  const socket = (redis as unknown as { stream: Socket & { _write: Socket['_write']; _writev?: Socket['_writev'] } }).stream;
  let n = 0;
  const write = socket._write.bind(socket);
  socket._write = (...args: Parameters<Socket['_write']>) => {
    n++;
    write(...args);
  };
  const writev = socket._writev?.bind(socket);
  if (writev) {
    socket._writev = (...args: Parameters<NonNullable<Socket['_writev']>>) => {
      n++;
      writev(...args);
    };
  }
  return { writes: () => n };
}

/** Polls without a fixed sleep: resolves when `pred` holds (fails after 5 s). */
async function until(pred: () => Promise<boolean>): Promise<void> {
  const end = Date.now() + 5000;
  while (!(await pred())) {
    if (Date.now() > end) throw new Error('condition not reached');
    await new Promise((r) => setImmediate(r));
  }
}

describe('tick writes', () => {
  it('sends the commands of one turn in one socket write, answered each in order', async () => {
    const redis = await ready('tick-one');
    const meter = countWrites(redis);
    const replies = await Promise.all(Array.from({ length: 50 }, (_, i) => redis.incrby('tick:one', i + 1)));
    expect(meter.writes()).toBe(1);
    // Redis ran them in the order issued: each reply is the running sum.
    expect(replies).toEqual(Array.from({ length: 50 }, (_, i) => ((i + 1) * (i + 2)) / 2));
    // Two turns, two writes.
    await redis.get('tick:one');
    await redis.get('tick:one');
    expect(meter.writes()).toBe(3);
  });

  it('writes a turn\'s commands while an earlier batch is still unanswered', async () => {
    const redis = await ready('tick-overlap');
    const other = await ready('tick-other');
    const name = `tick-overlap-${process.pid}`;
    await redis.client('SETNAME', name);
    // The first batch holds the connection on the server until `other` pushes.
    const blocked = redis.blpop('tick:gate', 0);
    await until(async () => /\bcmd=blpop\b/.test(await other.client('LIST') as string));
    // A later turn's command is written at once, not after the first batch's answer: the server
    // holds it in the blocked client's query buffer.
    const later = redis.get('tick:gate:later');
    await until(async () => {
      const line = (await other.client('LIST') as string).split('\n').find((l) => l.includes(`name=${name} `));
      return /\bqbuf=([1-9]\d*)\b/.test(line ?? '');
    });
    await other.rpush('tick:gate', 'open');
    expect(await blocked).toEqual(['tick:gate', 'open']);
    expect(await later).toBeNull();
  });

  it('flushTickWrites sends what the turn held back at once; duplicates coalesce too', async () => {
    const redis = await ready('tick-flush');
    const copy = redis.duplicate();
    clients.push(copy);
    await copy.ping();
    const meter = countWrites(redis);
    const copyMeter = countWrites(copy);
    const a = redis.set('tick:flush', '1');
    const b = copy.get('tick:flush');
    const c = copy.get('tick:flush');
    expect(meter.writes()).toBe(0);
    flushTickWrites();
    expect(meter.writes()).toBe(1);
    expect(copyMeter.writes()).toBe(1);
    await Promise.all([a, b, c]);
    expect(copyMeter.writes()).toBe(1);
  });

  it('keeps answering across a reconnection', async () => {
    const redis = await ready('tick-reconnect');
    const other = await ready('tick-reconnect-other');
    await redis.set('tick:re', 'before');
    const id = await redis.client('ID');
    await other.client('KILL', 'ID', String(id));
    // Commands issued while the client reconnects wait in its offline queue, then are answered.
    const replies = await Promise.all([redis.get('tick:re'), redis.set('tick:re', 'after'), redis.get('tick:re')]);
    expect(replies).toEqual(['before', 'OK', 'after']);
  });
});
