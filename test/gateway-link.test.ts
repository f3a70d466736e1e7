import { randomBytes } from 'node:crypto';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { WebSocket } from 'ws';
import { secretDigest } from '@agentplane/core';
import { GATEWAY_LINK_PATH, linkUrlOf } from '@agentplane/gateway';
import { connectRedis, freePort, keys, type Redis } from '@agentplane/store';
import { waitFor } from './harness/platform.js';
import { idleCount, SCRIPT, startTurnPlatform, untilEvents, type TurnPlatform } from './harness/turns.js';
import { sample } from './harness/metrics.js';

/**
 * Node links (docs/ARCHITECTURE.md): the scheduler sends a runner's frames straight to the gateway
 * node holding its socket, and the node answers over the same socket; a node that advertises no
 * link gets them by pub/sub, as before. A link upgrade needs a one-time ticket written for that
 * node.
 */

async function started(env: Record<string, string>, name: string): Promise<{ t: TurnPlatform; schedulerMetrics: () => Promise<string> }> {
  const port = await freePort();
  const t = await startTurnPlatform({ name, env: { SCHEDULER_PORT: String(port), ...env } });
  return { t, schedulerMetrics: async () => (await fetch(`http://127.0.0.1:${port}/metrics`)).text() };
}

async function oneTurn(t: TurnPlatform): Promise<void> {
  const sessionId = (await t.api.post<{ id: string }>('/v1/sessions', {
    agent: { name: 'scripted', model: 'default', system: SCRIPT([{ when: { user_contains: 'hello' }, then: [{ reply: 'hi' }] }]) },
    environment_id: t.envId,
  })).id;
  expect((await t.api.request('POST', `/v1/sessions/${sessionId}/events`, { body: t.msg('hello') })).status).toBeLessThan(300);
  const events = await untilEvents(t.api, sessionId, (e) => idleCount(e) >= 1, 30_000);
  expect(events.find((e) => e.type === 'session.status_idle')?.payload.stop_reason).toMatchObject({ type: 'end_turn' });
}

/** The answer to a link upgrade presented with this bearer: the status, or 101 once open. */
function upgrade(url: string, bearer: string | undefined): Promise<{ status: number; body: string }> {
  return new Promise((resolve, reject) => {
    const ws = new WebSocket(`${url}${GATEWAY_LINK_PATH}`, bearer ? { headers: { authorization: `Bearer ${bearer}` } } : {});
    ws.on('open', () => {
      ws.close();
      resolve({ status: 101, body: '' });
    });
    ws.on('unexpected-response', (_req, res) => {
      let body = '';
      res.on('data', (c: Buffer) => (body += c.toString()));
      res.on('end', () => resolve({ status: res.statusCode ?? 0, body }));
    });
    ws.on('error', (err) => (err.message.includes('Unexpected server response') ? undefined : reject(err)));
  });
}

describe('node links', () => {
  let s: Awaited<ReturnType<typeof started>>;
  let redis: Redis;
  beforeAll(async () => {
    s = await started({}, 'gateway-link');
    redis = connectRedis(s.t.p.redisUrl(), { name: 'test' });
  }, 150_000);
  afterAll(async () => {
    redis?.disconnect();
    await s?.t.p.stop();
  });

  it('carry offers to the node holding the runner, and its answers back, once open', async () => {
    await oneTurn(s.t);
    // The first frames to a node open its link (and go by pub/sub meanwhile): wait until it is open.
    await waitFor('a frame sent over a link', async () => {
      await oneTurn(s.t);
      return sample(await s.schedulerMetrics(), 'agentplane_gateway_link_sends_total', { route: 'link' }) > 0 ? true : undefined;
    }, 60_000);
    const before = sample(await s.schedulerMetrics(), 'agentplane_gateway_link_sends_total', { route: 'link' });
    const apiBefore = await (await fetch(`${s.t.p.baseUrl}/metrics`)).text();
    await oneTurn(s.t);
    // The offer (and its spec, when the runner takes it later) went over the link...
    expect(sample(await s.schedulerMetrics(), 'agentplane_gateway_link_sends_total', { route: 'link' })).toBeGreaterThan(before);
    const apiAfter = await (await fetch(`${s.t.p.baseUrl}/metrics`)).text();
    // ...and the node received it there and answered the acceptance over the same socket.
    expect(sample(apiAfter, 'agentplane_gateway_link_frames_total', { direction: 'in' })).toBeGreaterThan(sample(apiBefore, 'agentplane_gateway_link_frames_total', { direction: 'in' }));
    expect(sample(apiAfter, 'agentplane_gateway_link_frames_total', { direction: 'out' })).toBeGreaterThan(sample(apiBefore, 'agentplane_gateway_link_frames_total', { direction: 'out' }));
  }, 120_000);

  it('refuse an upgrade without a ticket, with a made-up or reused one, and one written for another node', async () => {
    const listed = await s.t.p.root.get<{ data: { runner: string; status: string }[] }>('/v1/runner-pools/presences');
    expect(listed.data.length).toBeGreaterThan(0);
    // The node id of the API's gateway: from the advertisement keys.
    const nodes = (await redis.keys(keys.global('gw_link:*'))).map((k) => k.slice(k.lastIndexOf(':') + 1));
    expect(nodes.length).toBe(1);
    const node = nodes[0] as string;
    const url = await linkUrlOf(redis, node);
    expect(url).toMatch(/^ws:\/\/127\.0\.0\.1:\d+$/);
    const refused = (r: { status: number; body: string }) => {
      expect(r.status).toBe(401);
      expect(JSON.parse(r.body)).toMatchObject({ error: { type: 'auth.invalid_key' } });
    };
    refused(await upgrade(url!, undefined));
    refused(await upgrade(url!, randomBytes(24).toString('base64url')));
    const ticketKey = (ticket: string) => keys.global(`gw_link_ticket:${secretDigest(ticket)}`);
    const elsewhere = randomBytes(24).toString('base64url');
    await redis.set(ticketKey(elsewhere), 'gw_someothernode', 'PX', 10_000);
    refused(await upgrade(url!, elsewhere));
    const ticket = randomBytes(24).toString('base64url');
    await redis.set(ticketKey(ticket), node, 'PX', 10_000);
    expect((await upgrade(url!, ticket)).status).toBe(101);
    refused(await upgrade(url!, ticket));
  }, 60_000);
});

describe('a gateway node without a link', () => {
  let s: Awaited<ReturnType<typeof started>>;
  beforeAll(async () => {
    s = await started({ GATEWAY_LINK_URL: 'off' }, 'gateway-nolink');
  }, 150_000);
  afterAll(async () => {
    await s?.t.p.stop();
  });

  it('gets its runners\' frames by pub/sub', async () => {
    await oneTurn(s.t);
    await oneTurn(s.t);
    const text = await s.schedulerMetrics();
    expect(sample(text, 'agentplane_gateway_link_sends_total', { route: 'pubsub' })).toBeGreaterThanOrEqual(2);
    expect(sample(text, 'agentplane_gateway_link_sends_total', { route: 'link' })).toBe(0);
  }, 120_000);
});
