/**
 * What crash tests share: platforms started with named crash points armed
 * (`AGENTPLANE_CRASH_AT`, packages/core/src/crash-points.ts), so a process kills itself the first
 * time it reaches one; the marker files of those points in one folder of the test's; a Redis
 * client on a platform's Redis; and the wait for the api that replaced the one that died.
 */
import { existsSync, mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Redis } from 'ioredis';
import { afterAll, expect } from 'vitest';
import { sha256Hex } from '@agentplane/core';
import type { HttpClient } from '@agentplane/client';
import { startPlatform, waitFor, type Platform, type StartOptions } from './platform.js';
import { startTurnPlatform, type Json, type TurnPlatform } from './turns.js';

export interface CrashPlatform {
  p: Platform;
  /**
   * The marker file of `point`: it exists once a process of this platform died there (removing
   * it arms the point again). Each platform has its own, so several may arm the same point.
   */
  marker(point: string): string;
  /** A client on the platform's Redis, connected on first use and disconnected at the end. */
  redis(): Redis;
  /**
   * Waits (up to `timeoutMs` per wait) for an api process other than `before` (the api pid read
   * before the crash) and, given a `probe`, for that api to answer `GET probe.path` with 200.
   */
  apiRestarted(before: number | undefined, probe?: { client: HttpClient; path: string }, timeoutMs?: number): Promise<void>;
}

/**
 * A keyed create that kills the api at `point` once it has written: `send` (the request under
 * `key`) fails, the point's marker shows the api died there, the api that replaces it answers
 * `GET probePath`, and the key's pending record, left by the dead api, is removed (as its expiry
 * would, its owner being dead), so the request's retry runs it again. `scope`: the key's hash tag
 * (default the Workspace's; `o:<organization>` for an Organization's operation).
 */
export async function crashedKeyed(
  q: CrashPlatform, point: string, key: string, send: () => Promise<unknown>, options: { probePath: string; scope?: string },
): Promise<void> {
  rmSync(q.marker(point), { force: true });
  const before = q.p.pids().api;
  await expect(send()).rejects.toThrow();
  expect(existsSync(q.marker(point))).toBe(true);
  await q.apiRestarted(before, { client: q.p.root, path: options.probePath });
  const record = `ap:{${options.scope ?? `w:${q.p.bootstrap.workspace_id}`}}:idem:${sha256Hex(key)}`;
  expect(await q.redis().get(record)).toContain('"pending"');
  expect(await q.redis().del(record)).toBe(1);
}

/** A crash platform started as `startTurnPlatform` starts one: its scheduler, runner and developer Workspace. */
export type CrashTurnPlatform = TurnPlatform & CrashPlatform;

export interface CrashPlatforms {
  /** `startPlatform(options)` with `points` armed (besides `options.env`). */
  start(points: readonly string[], options?: StartOptions): Promise<CrashPlatform>;
  /** `startTurnPlatform(options)` with `points` armed (besides `options.env`). */
  startTurn(points: readonly string[], options: { name: string; env?: Record<string, string>; environment?: Json }): Promise<CrashTurnPlatform>;
}

/**
 * The crash platforms of one test file (or of the `describe` it is called in): registers the
 * `afterAll` that disconnects their Redis clients, stops every platform started through it and
 * removes the marker folder (`<tmpdir>/<name>-…`, made at the first start).
 */
export function useCrashPlatforms(name: string): CrashPlatforms {
  let markers: string | undefined;
  let armed = 0;
  const started: { p: Platform; clients: Redis[] }[] = [];

  afterAll(async () => {
    const failures: unknown[] = [];
    for (const { p, clients } of started.splice(0)) {
      for (const c of clients) c.disconnect();
      await p.stop().catch((err: unknown) => failures.push(err));
    }
    if (markers) rmSync(markers, { recursive: true, force: true });
    if (failures.length > 0) throw failures[0];
  });

  /** The armed points' setting, and the marker of each, for the next platform. */
  const arm = (points: readonly string[]) => {
    markers ??= mkdtempSync(join(tmpdir(), `${name}-`));
    const dir = markers;
    const n = ++armed;
    const marker = (point: string): string => join(dir, `${n}-${point}`);
    return { marker, env: { AGENTPLANE_CRASH_AT: points.map((point) => `${point}:${marker(point)}`).join(',') } };
  };

  const adopt = (p: Platform, marker: (point: string) => string): CrashPlatform => {
    const entry = { p, clients: [] as Redis[] };
    started.push(entry);
    return {
      p,
      marker,
      redis() {
        entry.clients[0] ??= new Redis(p.redisUrl());
        return entry.clients[0];
      },
      async apiRestarted(before, probe, timeoutMs = 30_000) {
        await waitFor('the API restarted', () => (p.pids().api !== undefined && p.pids().api !== before ? true : undefined), timeoutMs);
        if (!probe) return;
        await waitFor('the API answering', async () => ((await probe.client.request('GET', probe.path).catch(() => null))?.status === 200 ? true : undefined), timeoutMs);
      },
    };
  };

  return {
    async start(points, options = {}) {
      const { marker, env } = arm(points);
      return adopt(await startPlatform({ ...options, env: { ...options.env, ...env } }), marker);
    },
    async startTurn(points, options) {
      const { marker, env } = arm(points);
      const turn = await startTurnPlatform({ ...options, env: { ...options.env, ...env } });
      return { ...turn, ...adopt(turn.p, marker) };
    },
  };
}
