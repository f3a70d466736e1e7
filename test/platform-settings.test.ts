import { execFileSync } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startPlatform, type Platform } from './harness/platform.js';

/**
 * `npm start` runs the api as a child process: the api's own settings set for the platform must
 * reach it (a setting the README lists that silently does nothing is worse than none).
 */
let p: Platform;

beforeAll(async () => {
  p = await startPlatform({ env: { METRICS_ENABLED: 'false', BODY_LIMIT_BYTES: '2048', PUBLIC_BASE_URL: 'https://agents.example.com', API_SEMI_SPACE_MIB: '32' } });
});
afterAll(async () => {
  await p?.stop();
});

describe('settings under npm start', () => {
  it('the api gets its own settings: metrics off, the body limit, the public address', async () => {
    expect((await fetch(`${p.baseUrl}/metrics`)).status).toBe(404);
    const big = await p.root.request<{ error: { type: string } }>('POST', '/v1/agents', { body: { name: 'big', model: 'default', system: 'x'.repeat(4096) } });
    expect([big.status, big.body.error.type]).toEqual([413, 'validation.payload_too_large']);
    const small = await p.root.request('POST', '/v1/agents', { body: { name: 'small', model: 'default' } });
    expect(small.status).toBe(201);
    const doc = await p.root.get<{ servers: { url: string }[] }>('/v1/openapi.json');
    expect(doc.servers[0]?.url).toBe('https://agents.example.com');
  });

  it('the api listens with a backlog for bursts of connections (the system\'s cap, not node\'s 511)', () => {
    const port = new URL(p.baseUrl).port;
    // For a listening socket `ss` shows its backlog as Send-Q.
    const line = execFileSync('ss', ['-Hltn', `sport = :${port}`], { encoding: 'utf8' }).trim().split('\n')[0] ?? '';
    const backlog = Number(line.split(/\s+/)[2]);
    const cap = Number(readFileSync('/proc/sys/net/core/somaxconn', 'utf8'));
    expect(backlog).toBe(Math.min(4096, cap));
  });

  it('the api runs with the young generation it is given (API_SEMI_SPACE_MIB)', () => {
    const args = readFileSync(`/proc/${String(p.pids().api)}/cmdline`, 'utf8').split('\0');
    expect(args).toContain('--max-semi-space-size=32');
  });
});
