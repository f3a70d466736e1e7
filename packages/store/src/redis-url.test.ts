import { describe, expect, it } from 'vitest';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { startEmbeddedRedis } from './embedded-redis.js';
import { connectRedis, isClusterUrl, parseRedisUrl, unixSocketUrl } from './redis.js';

describe('REDIS_URL', () => {
  it('reads a cluster seed list with a credential', () => {
    expect(isClusterUrl('redis+cluster://h1:7000,h2:7001')).toBe(true);
    expect(parseRedisUrl('redis+cluster://:p%40ss@10.0.0.1:7000, 10.0.0.2:7001,[::1]:7002')).toEqual({
      cluster: true, tls: false, password: 'p@ss',
      nodes: [{ host: '10.0.0.1', port: 7000 }, { host: '10.0.0.2', port: 7001 }, { host: '::1', port: 7002 }],
    });
    expect(parseRedisUrl('rediss+cluster://user:pw@h:1')).toMatchObject({ cluster: true, tls: true, username: 'user', password: 'pw' });
  });

  it('refuses a database number, a missing port or an empty list on a cluster', () => {
    expect(() => parseRedisUrl('redis+cluster://h1:7000/2')).toThrow(/database/);
    expect(() => parseRedisUrl('redis+cluster://h1')).toThrow(/host:port/);
    expect(() => parseRedisUrl('redis+cluster://')).toThrow(/at least one/);
  });

  it('keeps the single-server forms', () => {
    expect(isClusterUrl('redis://:pw@127.0.0.1:6380/1')).toBe(false);
    expect(parseRedisUrl('redis://:pw@127.0.0.1:6380/1')).toEqual({ cluster: false, tls: false, password: 'pw', db: 1, nodes: [{ host: '127.0.0.1', port: 6380 }] });
  });

  it('reads a Unix socket URL and refuses a malformed one', () => {
    expect(isClusterUrl('unix:///var/run/redis.sock')).toBe(false);
    expect(parseRedisUrl('unix:///var/run/redis.sock')).toEqual({ cluster: false, tls: false, nodes: [], path: '/var/run/redis.sock' });
    expect(parseRedisUrl('unix:///d/r%20s.sock?password=p%26w&db=2')).toEqual({ cluster: false, tls: false, nodes: [], path: '/d/r s.sock', password: 'p&w', db: 2 });
    expect(parseRedisUrl(unixSocketUrl('/a dir/#x?/redis.sock', 'pw&?='))).toMatchObject({ path: '/a dir/#x?/redis.sock', password: 'pw&?=' });
    expect(() => parseRedisUrl('unix://host/redis.sock')).toThrow(/no host/);
    expect(() => parseRedisUrl('unix:///r.sock?timeout=1')).toThrow(/unknown parameter 'timeout'/);
    expect(() => parseRedisUrl('unix:///r.sock?db=x')).toThrow(/database number/);
  });

  it('connects over a Unix socket', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'redis-unix-'));
    const server = await startEmbeddedRedis({ dir });
    try {
      expect(server.socketUrl).toMatch(/^unix:\/\//);
      const client = connectRedis(server.socketUrl as string, { name: 'unix-test' });
      try {
        await client.set('k', 'v');
        expect(await client.get('k')).toBe('v');
        // the same server as over TCP, and this connection is a Unix socket one (no port)
        const info = (await client.client('INFO')) as string;
        expect(info).toMatch(/laddr=\S*redis\.sock/);
        const dup = client.duplicate();
        expect(await dup.get('k')).toBe('v');
        dup.disconnect();
      } finally {
        client.disconnect();
      }
    } finally {
      await server.stop();
      rmSync(dir, { recursive: true, force: true });
    }
  });
});
