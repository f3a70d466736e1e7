import { mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { Redis } from 'ioredis';
import { startEmbeddedRedis, type EmbeddedRedis } from './embedded-redis.js';
import { singleRedis, unixSocketUrl } from './redis.js';

const dir = mkdtempSync(join(tmpdir(), 'agentplane-embedded-redis-'));
const started: EmbeddedRedis[] = [];
afterAll(async () => {
  for (const r of started) await r.stop();
  rmSync(dir, { recursive: true, force: true });
});

describe('embedded redis-server', () => {
  it('runs in its own process group, so a Ctrl-C to its owner\'s group does not reach it', async () => {
    const r = await startEmbeddedRedis({ dir: join(dir, 'group') });
    started.push(r);
    const stat = readFileSync(`/proc/${r.process.pid}/stat`, 'utf8');
    // Fields after the command name: state, ppid, pgrp.
    const pgrp = Number(stat.slice(stat.lastIndexOf(')') + 2).split(' ')[2]);
    expect(pgrp).toBe(r.process.pid);
    expect(pgrp).not.toBe(Number(readFileSync('/proc/self/stat', 'utf8').split(') ')[1]?.split(' ')[2]));
  });

  it('a server left running on the same directory (its owner was killed) is stopped at the next start, its data kept', async () => {
    const first = await startEmbeddedRedis({ dir: join(dir, 'stale') });
    const exited = new Promise<void>((resolve) => first.process.once('exit', () => resolve()));
    const c1 = new Redis(first.url);
    await c1.set('survives', 'yes');
    c1.disconnect();
    // Its owner "died": nobody stops it. The next start on the same directory must.
    const second = await startEmbeddedRedis({ dir: join(dir, 'stale') });
    started.push(second);
    await exited;
    expect(first.process.exitCode !== null || first.process.signalCode !== null).toBe(true);
    const c2 = new Redis(second.url);
    expect(await c2.get('survives')).toBe('yes');
    c2.disconnect();
  });

  it('listens on a Unix socket in its directory, and on TCP alone where a socket cannot be bound there', async () => {
    // A socket file left behind by a killed server does not stop the next start.
    mkdirSync(join(dir, 'sock'), { recursive: true });
    writeFileSync(join(dir, 'sock', 'redis.sock'), '');
    const withSocket = await startEmbeddedRedis({ dir: join(dir, 'sock') });
    started.push(withSocket);
    expect(withSocket.socketUrl).toBe(unixSocketUrl(join(dir, 'sock', 'redis.sock'), readFileSync(join(dir, 'sock', 'password'), 'utf8').trim()));
    const viaSocket = singleRedis(withSocket.socketUrl as string);
    await viaSocket.set('k', 'v');
    viaSocket.disconnect();
    const viaTcp = new Redis(withSocket.url);
    expect(await viaTcp.get('k')).toBe('v');
    viaTcp.disconnect();

    // A path too long for a socket address; and a directory in the socket's place.
    const long = join(dir, 'x'.repeat(100));
    const blocked = join(dir, 'blocked');
    mkdirSync(join(blocked, 'redis.sock'), { recursive: true });
    for (const d of [long, blocked]) {
      const r = await startEmbeddedRedis({ dir: d });
      started.push(r);
      expect(r.socketUrl).toBeUndefined();
      const c = new Redis(r.url);
      expect(await c.ping()).toBe('PONG');
      c.disconnect();
    }
  });
});

