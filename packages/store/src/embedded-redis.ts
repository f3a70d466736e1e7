import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { mkdirSync, readFileSync, writeFileSync, existsSync, rmSync } from 'node:fs';
import { createServer } from 'node:net';
import { join } from 'node:path';
import { Redis } from 'ioredis';
import { unixSocketUrl } from './redis.js';

/** sun_path holds 108 bytes on Linux (104 on the BSDs), its terminating NUL included. */
const MAX_SOCKET_PATH = 100;

export interface EmbeddedRedis {
  /** Over loopback TCP (`redis://:password@127.0.0.1:port`). */
  url: string;
  /**
   * Over its Unix socket (`unix://<dir>/redis.sock?password=…`), the cheaper way for processes on
   * this machine; absent where the path would be too long for a socket address.
   */
  socketUrl?: string;
  port: number;
  process: ChildProcess;
  stop(): Promise<void>;
}

export interface EmbeddedRedisOptions {
  /** Directory for the AOF files, the password and the log. */
  dir: string;
  port?: number;
  /** Server `hz`: how often Redis runs its timers. BullMQ's delayed retries are late by up to ~1000/hz ms. */
  hz?: number;
  onLog?: (line: string) => void;
}

export class RedisServerMissingError extends Error {
  constructor() {
    super(
      'redis-server was not found on PATH. Install it with:\n' +
        '    $(command -v sudo) apt-get update && $(command -v sudo) apt-get install -y redis-server      (Debian/Ubuntu)\n' +
        'or point the platform at an existing Redis with REDIS_URL=redis://host:6379',
    );
    this.name = 'RedisServerMissingError';
  }
}

/**
 * A command prefix (Linux's `setpriv --pdeathsig SIGTERM --`, when installed) under which a
 * child gets SIGTERM as soon as the process that started it dies, even by SIGKILL; empty where
 * it is not available.
 */
export function parentDeathWrapper(): string[] {
  if (process.platform !== 'linux') return [];
  const r = spawnSync('setpriv', ['--help'], { encoding: 'utf8' });
  return r.error === undefined && r.status === 0 && r.stdout.includes('--pdeathsig') ? ['setpriv', '--pdeathsig', 'SIGTERM', '--'] : [];
}

const alive = (pid: number): boolean => {
  try {
    process.kill(pid, 0);
    return true;
  } catch (err) {
    return (err as NodeJS.ErrnoException).code === 'EPERM';
  }
};

/**
 * A redis-server left behind on `dir` by a platform that was killed outright (SIGKILL gives it no
 * chance to stop its children): stop it (SIGTERM, so its AOF is flushed; SIGKILL after 5 s)
 * before a new one opens the same files. Only a process that is a redis-server is touched: the
 * pid file alone could name a recycled pid.
 */
async function stopStaleServer(pidFile: string): Promise<number | undefined> {
  if (!existsSync(pidFile)) return undefined;
  const pid = Number(readFileSync(pidFile, 'utf8').trim());
  rmSync(pidFile, { force: true });
  if (!Number.isInteger(pid) || pid <= 1 || pid === process.pid || !alive(pid)) return undefined;
  let cmdline = '';
  try {
    cmdline = readFileSync(`/proc/${pid}/cmdline`, 'utf8');
  } catch {
    return undefined; // no /proc, or gone: leave it alone
  }
  if (!cmdline.includes('redis-server')) return undefined;
  process.kill(pid, 'SIGTERM');
  const deadline = Date.now() + 5000;
  while (alive(pid)) {
    if (Date.now() > deadline) {
      process.kill(pid, 'SIGKILL');
      break;
    }
    await new Promise((r) => setTimeout(r, 50));
  }
  return pid;
}

export function redisServerAvailable(): boolean {
  const r = spawnSync('redis-server', ['--version'], { stdio: 'ignore' });
  return r.error === undefined && r.status === 0;
}

function bindable(port: number): Promise<number | null> {
  return new Promise((resolve) => {
    const srv = createServer();
    srv.unref();
    srv.once('error', () => resolve(null));
    srv.listen(port, '127.0.0.1', () => {
      const addr = srv.address();
      const bound = typeof addr === 'object' && addr ? addr.port : null;
      srv.close(() => resolve(bound));
    });
  });
}

/**
 * A free loopback port for a server that binds it a moment later. Drawn at random below Linux's
 * ephemeral range (32768 and up): a port the kernel hands to some other process's `listen(0)`
 * in between would make the later bind fail, or worse, leave a client talking to the wrong
 * server. Falls back to a kernel-chosen port if none is free there.
 */
export async function freePort(): Promise<number> {
  for (let i = 0; i < 50; i++) {
    const port = await bindable(20_000 + Math.floor(Math.random() * 12_000));
    if (port !== null) return port;
  }
  const port = await bindable(0);
  if (port === null) throw new Error('no free loopback port');
  return port;
}

/**
 * Whether a Unix socket can be bound at `path`: its address fits a socket address, and the file
 * system under it takes sockets (some mounted or network file systems refuse them, and a
 * redis-server told to listen there would not start). Probed by binding it for a moment.
 */
async function socketUsable(path: string): Promise<boolean> {
  if (process.platform === 'win32' || Buffer.byteLength(path) > MAX_SOCKET_PATH) return false;
  try {
    // A socket file a killed server left behind: redis-server replaces it, so may the probe.
    rmSync(path, { force: true });
  } catch {
    return false; // not a file that can go (a directory of that name)
  }
  return new Promise((resolve) => {
    const srv = createServer();
    srv.once('error', () => resolve(false));
    srv.listen(path, () => srv.close(() => {
      rmSync(path, { force: true });
      resolve(true);
    }));
  });
}

/**
 * A private redis-server for one platform: loopback only, password-protected,
 * append-only file on (fsync every second) under `dir`.
 *
 * It runs in its own process group (`detached`), so a terminal's Ctrl-C, which signals the
 * whole foreground group, does not stop it before the processes that use it: its owner stops
 * it last. It never outlives its owner: on Linux it gets SIGTERM when the owner dies (even by
 * SIGKILL), and everywhere a server left running on `dir` (pid file) is stopped at the next start.
 */
export async function startEmbeddedRedis(options: EmbeddedRedisOptions): Promise<EmbeddedRedis> {
  if (!redisServerAvailable()) throw new RedisServerMissingError();
  mkdirSync(options.dir, { recursive: true, mode: 0o700 });
  const passwordFile = join(options.dir, 'password');
  if (!existsSync(passwordFile)) writeFileSync(passwordFile, randomBytes(24).toString('hex'), { mode: 0o600 });
  const password = readFileSync(passwordFile, 'utf8').trim();
  const pidFile = join(options.dir, 'redis.pid');
  const stale = await stopStaleServer(pidFile);
  if (stale !== undefined) options.onLog?.(`stopped a redis-server (pid ${stale}) left running on ${options.dir}`);
  const port = options.port ?? (await freePort());
  const socket = join(options.dir, 'redis.sock');
  const useSocket = await socketUsable(socket);
  const args = [
    '--port', String(port),
    '--bind', '127.0.0.1',
    // The socket lives in the 0700 directory, itself 0700: only this user reaches it.
    ...(useSocket ? ['--unixsocket', socket, '--unixsocketperm', '700'] : []),
    '--protected-mode', 'yes',
    '--dir', options.dir,
    '--appendonly', 'yes',
    '--appendfsync', 'everysec',
    '--appenddirname', 'aof',
    '--save', '',
    '--hz', String(options.hz ?? 100),
    '--maxmemory-policy', 'noeviction',
    '--daemonize', 'no',
    '--logfile', '',
    '--pidfile', pidFile,
  ];
  const [cmd = 'redis-server', ...pre] = [...parentDeathWrapper(), 'redis-server'];
  const child = spawn(cmd, [...pre, '-'], { stdio: ['pipe', 'pipe', 'pipe'], detached: true });
  // The password goes through stdin (a config file on "-"), never the process list.
  child.stdin.end(`${args.reduce((acc, cur, i) => (i % 2 === 0 ? `${acc}${cur.slice(2)} ` : `${acc}"${cur}"\n`), '')}requirepass "${password}"\n`);
  const lines = (buf: Buffer) => buf.toString('utf8').split('\n').filter(Boolean).forEach((l) => options.onLog?.(l));
  child.stdout.on('data', lines);
  child.stderr.on('data', lines);
  const url = `redis://:${password}@127.0.0.1:${port}`;
  const exited = new Promise<void>((resolve) => child.once('exit', () => resolve()));

  const probe = new Redis(url, { lazyConnect: true, maxRetriesPerRequest: 0, retryStrategy: () => null });
  probe.on('error', () => undefined);
  const deadline = Date.now() + 15_000;
  for (;;) {
    if (child.exitCode !== null) throw new Error(`redis-server exited with code ${child.exitCode} during start`);
    try {
      if (probe.status !== 'ready') await probe.connect();
      // An AOF being loaded answers LOADING; wait for real readiness.
      await probe.ping();
      break;
    } catch {
      if (Date.now() > deadline) {
        child.kill('SIGKILL');
        throw new Error('redis-server did not become ready within 15 s');
      }
      probe.disconnect();
      await new Promise((r) => setTimeout(r, 50));
    }
  }
  probe.disconnect();
  writeFileSync(join(options.dir, 'port'), String(port), { mode: 0o600 });

  return {
    url,
    ...(useSocket ? { socketUrl: unixSocketUrl(socket, password) } : {}),
    port,
    process: child,
    async stop() {
      if (child.exitCode !== null) return;
      child.kill('SIGTERM');
      const timer = setTimeout(() => child.kill('SIGKILL'), 5000);
      await exited;
      clearTimeout(timer);
    },
  };
}
