/**
 * Session streams under back-pressure, against a real platform: a viewer that stops reading is
 * cut off (docs/API.md "Streams": once 8 MiB are due to it, counted by reason on /metrics)
 * whether its events travel inline (small batches) or are announced only (batches over 64 KiB,
 * read from the log), and the API holds at most that much for it meanwhile (its queued bytes,
 * read from /metrics after every append); a viewer that reads gets every event once, in order.
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
const MiB = 1024 * 1024;

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

/** A labelled sample of a metric (`name{reason="behind"}`), 0 when absent. */
async function labelled(name: string, label: string): Promise<number> {
  const text = await (await fetch(`${p.baseUrl}/metrics`)).text();
  const m = new RegExp(`^${name}\\{${label}\\} (\\S+)$`, 'm').exec(text);
  return m ? Number(m[1]) : 0;
}

describe('a viewer that stops reading', () => {
  it('is cut off once 8 MiB are due to it, inline and announced batches alike, and the API holds at most that for it; a reading viewer gets every event once, in order', async () => {
    const ev = (thread: string, n: number) => ({ type: 'user.message', payload: { content: 'x'.repeat(n), authored_by: principal, caused_by: { kind: 'api' } }, session_thread_id: thread });
    const streams = () => metric('agentplane_sse_streams');
    const behind = () => labelled('agentplane_sse_cut_off_total', 'reason="behind"');
    let peak = 0;

    /**
     * A stalled viewer and a reading one on a new Session, then appends of `batch` until the API
     * cut the stalled one off for being behind (not for stalling: that takes 30 s). What the API
     * holds for its viewers is read after every append.
     */
    const scenario = async (batch: (thread: string) => ReturnType<typeof ev>[]) => {
      const id = (await p.root.post<{ id: string }>('/v1/sessions', { agent, environment_id: env })).id;
      const thread = (await store.get(p.bootstrap.workspace_id, id))._primary_thread_id;
      const cutBefore = await behind();
      const stalled = await stalledViewer(id);
      const reader = readingViewer(id);
      await waitFor('both streams open', async () => (reader.open() && (await streams()) === 2 ? true : undefined), 60_000);
      let count = 0;
      // At most 60 MB or more: far more than any socket buffer and the 8 MiB bound take.
      for (let i = 0; i < 1_000 && (await behind()) === cutBefore; i++) {
        const b = batch(thread);
        await store.log.append(id, b);
        count += b.length;
        peak = Math.max(peak, await metric('agentplane_sse_queued_bytes'));
      }
      expect(await behind()).toBe(cutBefore + 1);
      // The stalled viewer's stream ended in the API (only the reader's is left) …
      await waitFor('the stalled viewer cut off', async () => (reader.open() && (await streams()) === 1 ? true : undefined), 60_000);
      // … and its connection closes once it reads again (nothing is left waiting for it).
      stalled.sock.resume();
      await Promise.race([stalled.closed, waitFor('the stalled socket closed', () => undefined, 30_000)]);
      // The reader got every event exactly once, in order (across its resumes, if any).
      await waitFor('the reader caught up', () => (reader.ids.length >= count ? true : undefined), 60_000);
      expect(reader.ids).toEqual(Array.from({ length: count }, (_, k) => k + 1));
      reader.close();
      await waitFor('the reader closed', async () => ((await streams()) === 0 ? true : undefined), 60_000);
    };

    // Batches under 64 KiB: their events travel inline in the live message, written at once.
    await scenario((t) => [ev(t, 20_000), ev(t, 20_000), ev(t, 20_000)]);
    // Batches over 64 KiB: announced only, read from the log by each viewer.
    await scenario((t) => [ev(t, 100_000), ev(t, 100_000)]);
    // Two viewers at a time, each cut off past 8 MiB due to it, plus a page of the log or a batch.
    expect(peak).toBeGreaterThan(0);
    expect(peak).toBeLessThan(2 * (8 + 1) * MiB);
  }, 180_000);
});
