/**
 * Session streams under back-pressure, against a real platform: a viewer that stops reading is
 * cut off (docs/API.md "Streams": once 8 MiB are due to it) whether its events travel inline
 * (small batches) or are announced only (batches over 64 KiB, read from the log), and the API
 * holds nothing more for it meanwhile; a viewer that reads gets every event once, in order.
 */
import { connect, type Socket } from 'node:net';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { Redis } from 'ioredis';
import { SessionStore } from '@agentplane/domain';
import { startPlatform, waitFor, type Platform } from './harness/platform.js';

let p: Platform;
let redis: Redis;
let store: SessionStore;
let principal: string;
let env: string;
let agent: string;

beforeAll(async () => {
  p = await startPlatform();
  redis = new Redis(p.redisUrl());
  store = new SessionStore(redis);
  principal = (await p.root.post<{ id: string }>(`/v1/organizations/workspaces/${p.bootstrap.workspace_id}/principals`, {
    external_subject_id: 'u-backpressure', principal_type: 'person', display_name: 'U',
  })).id;
  env = (await p.root.post<{ id: string }>('/v1/environments', { name: 'default', image: 'agentplane/sandbox:1' })).id;
  agent = (await p.root.post<{ id: string }>('/v1/agents', { name: 'a', model: 'default' })).id;
}, 120_000);
afterAll(async () => {
  redis?.disconnect();
  await p?.stop();
});

async function metric(name: string): Promise<number> {
  const text = await (await fetch(`${p.baseUrl}/metrics`)).text();
  const m = new RegExp(`^${name} (\\S+)$`, 'm').exec(text);
  return Number(m?.[1]);
}

const streamRequest = (sessionId: string) =>
  `GET /v1/sessions/${sessionId}/events/stream HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ${p.bootstrap.root_key}\r\nService-Version: 2026-08-27\r\n\r\n`;

/** A raw viewer that reads the response headers, then stops reading (its socket paused). */
function stalledViewer(sessionId: string): Promise<{ sock: Socket; closed: Promise<void> }> {
  return new Promise((resolve, reject) => {
    const sock = connect(p.port, '127.0.0.1');
    const closed = new Promise<void>((r) => sock.once('close', () => r()));
    sock.on('error', () => undefined);
    let got = '';
    const onData = (b: Buffer) => {
      got += b.toString('latin1');
      if (!got.includes('\r\n\r\n')) return;
      sock.off('data', onData);
      sock.pause();
      if (!got.startsWith('HTTP/1.1 200')) reject(new Error(got.split('\r\n')[0]));
      else resolve({ sock, closed });
    };
    sock.on('data', onData);
    sock.on('connect', () => sock.write(streamRequest(sessionId)));
  });
}

/**
 * A viewer that reads everything and keeps the ids of the event frames it got; a stream that
 * ends (a viewer that fell 8 MiB behind is cut off too) is resumed with Last-Event-ID, as
 * clients do.
 */
function readingViewer(sessionId: string): { ids: number[]; open: () => boolean; close: () => void } {
  const ids: number[] = [];
  let stopped = false;
  let sock: Socket;
  let open = false;
  const start = () => {
    const last = ids.at(-1);
    sock = connect(p.port, '127.0.0.1');
    sock.on('error', () => undefined);
    sock.setEncoding('latin1');
    let text = '';
    sock.on('data', (chunk: string) => {
      if (!open && chunk.startsWith('HTTP/1.1 200')) open = true;
      text += chunk;
      // Frames are separated by a blank line; keep the unfinished tail.
      const cut = text.lastIndexOf('\n\n');
      if (cut < 0) return;
      for (const m of text.slice(0, cut).matchAll(/^id: (\d+)\nevent: user\.message$/gm)) ids.push(Number(m[1]));
      text = text.slice(cut + 2);
    });
    sock.on('close', () => {
      open = false;
      if (!stopped) start();
    });
    const request = streamRequest(sessionId);
    sock.on('connect', () => sock.write(last === undefined ? request : request.replace('\r\n\r\n', `\r\nLast-Event-ID: ${last}\r\n\r\n`)));
  };
  start();
  return { ids, open: () => open, close: () => { stopped = true; sock.destroy(); } };
}

describe('a viewer that stops reading', () => {
  it('is cut off once 8 MiB are due to it, inline and announced batches alike, and the API does not hold what is appended after; a reading viewer gets every event once, in order', async () => {
    const newStream = async () => {
      const id = (await p.root.post<{ id: string }>('/v1/sessions', { agent, environment_id: env })).id;
      return { id, thread: (await store.get(p.bootstrap.workspace_id, id))._primary_thread_id };
    };
    /**
     * About 37 MB: every tenth append a batch over 64 KiB (announced only, read from the log by
     * each viewer), the others batches under it (their events inline in the live message).
     */
    const fill = async (s: { id: string; thread: string }) => {
      const ev = (n: number) => ({ type: 'user.message', payload: { content: 'x'.repeat(n), authored_by: principal, caused_by: { kind: 'api' } }, session_thread_id: s.thread });
      let bytes = 0;
      let count = 0;
      for (let i = 0; i < 500; i++) {
        const batch = i % 10 === 0 ? [ev(100_000), ev(100_000)] : [ev(20_000), ev(20_000), ev(20_000)];
        await store.log.append(s.id, batch);
        bytes += batch.length * batch[0]!.payload.content.length;
        count += batch.length;
      }
      return { bytes, count };
    };
    const streams = () => metric('agentplane_sse_streams');

    // The same appends with a reading viewer only: what the API's heap grows by anyway.
    const calm = await newStream();
    const alone = readingViewer(calm.id);
    await waitFor('the stream open', async () => (alone.open() && (await streams()) === 1 ? true : undefined), 60_000);
    const calmBefore = await metric('nodejs_heap_size_used_bytes');
    const calmFill = await fill(calm);
    await waitFor('the reader caught up', () => (alone.ids.length >= calmFill.count ? true : undefined), 60_000);
    const calmGrowth = (await metric('nodejs_heap_size_used_bytes')) - calmBefore;
    alone.close();
    await waitFor('the stream closed', async () => ((await streams()) === 0 ? true : undefined), 60_000);

    const s = await newStream();
    const stalled = await stalledViewer(s.id);
    const reader = readingViewer(s.id);
    await waitFor('both streams open', async () => (reader.open() && (await streams()) === 2 ? true : undefined), 60_000);
    const heapBefore = await metric('nodejs_heap_size_used_bytes');
    const { bytes: appended, count } = await fill(s);
    // The reader got every event exactly once, in order (across its resumes, if any).
    await waitFor('the reader caught up', () => (reader.ids.length >= count ? true : undefined), 60_000);
    expect(reader.ids).toEqual(Array.from({ length: count }, (_, k) => k + 1));
    // The stalled viewer was cut off: its stream ended in the API (only the reader's is left) …
    await waitFor('the stalled viewer cut off', async () => (reader.open() && (await streams()) === 1 ? true : undefined), 60_000);
    // … and its connection closes once it reads again (nothing is left waiting for it).
    stalled.sock.resume();
    await Promise.race([stalled.closed, waitFor('the stalled socket closed', () => undefined, 30_000)]);
    // The API did not keep what was appended for the viewer that stopped reading: its heap grew
    // less than it does for a reading viewer alone plus the appended amount (a generous bound,
    // for the collector's timing; holding it would add the appended amount to what it keeps).
    const growth = (await metric('nodejs_heap_size_used_bytes')) - heapBefore;
    expect(growth).toBeLessThan(Math.max(calmGrowth, 0) + appended);
    reader.close();
  }, 180_000);
});
