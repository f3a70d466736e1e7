import { describe, expect, it } from 'vitest';
import { isClusterUrl, parseRedisUrl } from './redis.js';

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
});
