import type { ChildProcess } from 'node:child_process';
import { mkdtempSync, readFileSync, existsSync, createWriteStream, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { HttpClient } from '@agentplane/client';
import { freePort, unixSocketUrl } from '@agentplane/store';
import { linesRepeatingKeys } from './log-lines.js';
import { spawnOwned } from './spawn.js';

export const ROOT_DIR = resolve(import.meta.dirname, '..', '..');

export interface Bootstrap {
  organization_id: string;
  workspace_id: string;
  root_key: string;
  base_url: string;
}

export interface StartOptions {
  env?: Record<string, string>;
  runner?: boolean;
  scheduler?: boolean;
  /** Reuse a data dir (restart tests). */
  dataDir?: string;
  port?: number;
  /** How long the platform may take to answer /healthz (default 30 s). */
  startTimeoutMs?: number;
}

export interface Platform {
  baseUrl: string;
  port: number;
  dataDir: string;
  bootstrap: Bootstrap;
  /** Root-key client (organization scope, default workspace). */
  root: HttpClient;
  /** A client with no credential. */
  anon: HttpClient;
  proc: ChildProcess;
  logFile: string;
  pids(): Record<string, number | undefined>;
  /** Redis URL of the embedded server, over loopback TCP (a plain `new Redis(url)` takes it). */
  redisUrl(): string;
  /**
   * The URL the platform's own processes reach the embedded server by: its Unix socket when it
   * has one (`unix://…`; open it with `singleRedis`), else the TCP one. Benches' raw floors use it.
   */
  redisSocketUrl(): string;
  stop(): Promise<void>;
}

async function waitFor<T>(what: string, fn: () => Promise<T | undefined> | T | undefined, timeoutMs = 30_000): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const v = await fn();
    if (v !== undefined) return v;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 50));
  }
}

export { waitFor };

/** The api could not listen on the port the harness chose: another process of the run took it first. */
class PortTaken extends Error {}

/**
 * Start the platform exactly as the README does (`node platform/dist/main.js`), on its own port, data dir and Redis.
 *
 * A port the harness chooses is free when chosen, but the test files run in parallel and another
 * process of the run can take it before the api listens (a few seconds later, on a loaded
 * machine): the platform then stops at once, naming EADDRINUSE, and is started again on another
 * port (at most three times). A port the test chose is not changed.
 */
export async function startPlatform(options: StartOptions = {}): Promise<Platform> {
  for (let attempt = 1; ; attempt++) {
    try {
      return await startPlatformOnce(options);
    } catch (err) {
      if (!(err instanceof PortTaken) || options.port !== undefined || attempt >= 3) throw err;
    }
  }
}

async function startPlatformOnce(options: StartOptions): Promise<Platform> {
  const dataDir = options.dataDir ?? mkdtempSync(join(tmpdir(), 'agentplane-test-'));
  const port = options.port ?? (await freePort());
  const logFile = join(dataDir, `platform-${Date.now()}.log`);
  const log = createWriteStream(logFile);
  // The platform gets SIGTERM when the process that started it dies without stopping it (a test
  // worker or a bench killed, a closed output pipe): it stops its own children, so no platform
  // is left loading the machine for the tests and benches that follow.
  const proc = spawnOwned(process.execPath, [join(ROOT_DIR, 'platform/dist/main.js')], {
    env: {
      PATH: process.env.PATH ?? '/usr/bin:/bin',
      HOME: process.env.HOME ?? '/tmp',
      DATA_DIR: dataDir,
      PORT: String(port),
      LOG_LEVEL: process.env.TEST_LOG_LEVEL ?? 'info',
      START_RUNNER: String(options.runner ?? false),
      START_SCHEDULER: String(options.scheduler ?? false),
      // The test run's reaping scope (test/harness/global-teardown.ts): its sandboxes carry it.
      ...(process.env.AGENTPLANE_SANDBOX_SCOPE ? { AGENTPLANE_SANDBOX_SCOPE: process.env.AGENTPLANE_SANDBOX_SCOPE } : {}),
      ...options.env,
    },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  proc.stdout?.pipe(log);
  proc.stderr?.pipe(log);
  const exited = new Promise<void>((r) => proc.once('exit', () => r()));
  const bootstrapFile = join(dataDir, 'bootstrap.json');
  const baseUrl = `http://127.0.0.1:${port}`;
  /** SIGTERM (SIGKILL after 20 s), wait for the exit, close the log. */
  const terminate = async (): Promise<void> => {
    if (proc.exitCode === null && proc.signalCode === null) {
      proc.kill('SIGTERM');
      const timer = setTimeout(() => proc.kill('SIGKILL'), 20_000);
      await exited;
      clearTimeout(timer);
    }
    await new Promise<void>((resolve) => log.end(resolve));
  };
  try {
    // Generous: a loaded 2-core machine can take a while to start five processes.
    await waitFor('the platform to start', async () => {
      if (proc.exitCode !== null) {
        const text = readFileSync(logFile, 'utf8');
        const message = `platform exited with ${proc.exitCode}; log: ${text.slice(-2000)}`;
        throw text.includes(`EADDRINUSE: address already in use 127.0.0.1:${port}`) ? new PortTaken(message) : new Error(message);
      }
      if (!existsSync(bootstrapFile)) return undefined;
      try {
        // Our API, not whatever else may answer on this port: the bootstrap key opens it.
        const key = (JSON.parse(readFileSync(bootstrapFile, 'utf8')) as Bootstrap).root_key;
        // Bounded: whatever else holds the port (the api could not listen) may never answer.
        const r = await new HttpClient({ baseUrl, token: key }).request('GET', '/v1/support/capabilities', { signal: AbortSignal.timeout(5_000) });
        return r.status === 200 ? true : undefined;
      } catch {
        return undefined;
      }
    }, options.startTimeoutMs ?? 75_000); // under the 90 s hook timeout, so the clean-up below runs
  } catch (err) {
    // Never leave a half-started platform (and its Redis and children) running behind a failed test.
    await terminate();
    if (err instanceof PortTaken && !options.dataDir) rmSync(dataDir, { recursive: true, force: true });
    throw err;
  }
  const bootstrap = JSON.parse(readFileSync(bootstrapFile, 'utf8')) as Bootstrap;
  const platform: Platform = {
    baseUrl,
    port,
    dataDir,
    bootstrap,
    root: new HttpClient({ baseUrl, token: bootstrap.root_key }),
    anon: new HttpClient({ baseUrl }),
    proc,
    logFile,
    pids: () => JSON.parse(readFileSync(join(dataDir, 'processes.json'), 'utf8')) as Record<string, number | undefined>,
    redisUrl: () => {
      const password = readFileSync(join(dataDir, 'redis', 'password'), 'utf8').trim();
      const port = readFileSync(join(dataDir, 'redis', 'port'), 'utf8').trim();
      return `redis://:${password}@127.0.0.1:${port}`;
    },
    redisSocketUrl: () => {
      const socket = join(dataDir, 'redis', 'redis.sock');
      if (!existsSync(socket)) return platform.redisUrl();
      return unixSocketUrl(socket, readFileSync(join(dataDir, 'redis', 'password'), 'utf8').trim());
    },
    async stop() {
      await terminate();
      // Every line the platform's processes wrote names each field once (./log-lines.ts). A log
      // already gone (a second stop, a test that removed the data directory) has no lines.
      const repeating = linesRepeatingKeys(logFile);
      if (!options.dataDir && !process.env.KEEP_TEST_DATA) rmSync(dataDir, { recursive: true, force: true });
      if (repeating.length > 0) throw new Error(`log lines that repeat a key (${repeating.length}):\n${repeating.slice(0, 5).join('\n')}`);
    },
  };
  return platform;
}
