import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { mkdirSync, readFileSync, writeFileSync, existsSync } from 'node:fs';
import { createServer } from 'node:net';
import { join } from 'node:path';
import { Redis } from 'ioredis';

export interface EmbeddedRedis {
  url: string;
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
        '    sudo apt-get install -y redis-server      (Debian/Ubuntu)\n' +
        'or point the platform at an existing Redis with REDIS_URL=redis://host:6379',
    );
    this.name = 'RedisServerMissingError';
  }
}

export function redisServerAvailable(): boolean {
  const r = spawnSync('redis-server', ['--version'], { stdio: 'ignore' });
  return r.error === undefined && r.status === 0;
}

export async function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const srv = createServer();
    srv.unref();
    srv.on('error', reject);
    srv.listen(0, '127.0.0.1', () => {
      const addr = srv.address();
      const port = typeof addr === 'object' && addr ? addr.port : 0;
      srv.close(() => resolve(port));
    });
  });
}

/**
 * A private redis-server for one platform: loopback only, password-protected,
 * append-only file on (fsync every second) under `dir`.
 */
export async function startEmbeddedRedis(options: EmbeddedRedisOptions): Promise<EmbeddedRedis> {
  if (!redisServerAvailable()) throw new RedisServerMissingError();
  mkdirSync(options.dir, { recursive: true, mode: 0o700 });
  const passwordFile = join(options.dir, 'password');
  if (!existsSync(passwordFile)) writeFileSync(passwordFile, randomBytes(24).toString('hex'), { mode: 0o600 });
  const password = readFileSync(passwordFile, 'utf8').trim();
  const port = options.port ?? (await freePort());
  const args = [
    '--port', String(port),
    '--bind', '127.0.0.1',
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
  ];
  const child = spawn('redis-server', ['-'], { stdio: ['pipe', 'pipe', 'pipe'] });
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
