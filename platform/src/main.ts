import { randomBytes } from 'node:crypto';
import { existsSync, mkdirSync, renameSync, writeFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { join } from 'node:path';
import { ConfigError, createLogger, strictCommandLine } from '@agentplane/core';
import { connectRedis, DocumentStore, startEmbeddedRedis, RedisServerMissingError, waitForRedis, type EmbeddedRedis } from '@agentplane/store';
import { bootstrapPlatform, CredentialIndex, IdentityService, RunnerService } from '@agentplane/domain';
import { RUNNER_EXIT } from '@agentplane/protocol';
import { ensureLocalRunner } from './local-runner.js';
import { reportEarlierSandboxes, stopRunnerSandboxes } from './leftovers.js';
import { loadPlatformConfig } from './config.js';
import { acquirePlatformLock, PlatformRunningError } from './lock.js';
import { awaitEarlierChildren } from './earlier.js';
import { Supervisor, type FatalExit } from './supervisor.js';

const HELP = `agentplane: start the whole platform on this machine

Usage: npm start            (or: node platform/dist/main.js [--bootstrap-only] [--help])

Starts a private redis-server (AOF on, under $DATA_DIR/redis) unless REDIS_URL is set,
bootstraps an Organization, a Workspace and a root API key on first boot, then runs the
API (with the runner gateway), the scheduler and one local runner.

Environment:
  DATA_DIR          where state lives (default ./.data)
  PORT, HOST        API listen address (default 8080, 127.0.0.1)
  REDIS_URL         use this Redis instead of the embedded one: redis://[:password@]host:port,
                    a local one by its socket: unix:///path/redis.sock[?password=...],
                    or a Redis Cluster: redis+cluster://[:password@]host1:port1,host2:port2,...
  --bootstrap-only  first boot against REDIS_URL (Organization, Workspace, root key), then exit
  REDIS_HZ          embedded Redis hz (default 100: delayed retries late by at most ~10 ms)
  REDIS_SOCKET      reach the embedded Redis by its Unix socket (default true; false: loopback TCP)
  LOG_LEVEL         fatal|error|warn|info|debug|trace|silent (default info)
  START_SCHEDULER   start the scheduler process (default true)
  SCHEDULER_PORT    where the scheduler serves /metrics (default 0: an ephemeral port)
  RUNNER_METRICS_ADDR  host:port where the local runner serves /metrics (default: not served)
  OTEL_*            OpenTelemetry tracing for every process, off by default (docs/OPERATIONS.md)
  START_RUNNER      start a local runner paired to the default workspace (default true)
  RUNNER_DRAIN_DEADLINE_MS  on a stop, how long the local runner finishes held work before it
                    cancels the rest (default 10000)
  SHUTDOWN_GRACE_MS on a stop, the api's and the scheduler's graceful stop (default 10000)
  RESTART_CHILDREN  restart a crashed api, scheduler or runner (default true)
  API_SEMI_SPACE_MIB  the api's young-generation semi-space, MiB (default 64; 0: V8's own)
  DOCS_URL          documentation base used in error bodies (default https://docs.agentplane.dev)
  CONSOLE_ENABLED   serve the web console at /console (default true)
  CONSOLE_DIR       the built console to serve (default the repository's console/dist)
  PUBLIC_BASE_URL   the address clients reach the API at (default http://HOST:PORT)
  SCHEDULER_HOST    where the scheduler listens for /metrics (default 127.0.0.1)
  SANDBOX_IDLE_SUSPEND_SECONDS, SANDBOX_IDLE_EXPIRE_SECONDS, SANDBOX_REPORT_SECONDS,
  SANDBOX_REAP_INTERVAL_SECONDS, SANDBOX_REAP_GRACE_SECONDS, AGENTPLANE_SANDBOX_SCOPE,
  REPOSITORY_MAX_MIB, RUNNER_MAX_SLOTS, RUNNER_SLOT_MEMORY_MIB, RUNNER_TIERS, RUNNER_BROWSER,
  RUNNER_BROWSER_IMAGE, RUNNER_EXIT_WHEN_DRAINED, RUNNER_REQUIRE_DOCKER, RUNNER_ACP_HARNESSES,
  DOCKER_SOCKET, GIT_SSL_CAINFO, GIT_SSH_COMMAND, SSH_AUTH_SOCK, HTTPS_PROXY, HTTP_PROXY, NO_PROXY
                    passed to the local runner (see agentplane-runner start --help)
  The api's and the scheduler's own settings (leases, models, automations, webhooks, audit,
  memory, limits) are passed to them unchanged: the README's settings table and
  docs/OPERATIONS.md ("Other settings") list them.

Stopping (Ctrl-C, SIGTERM, SIGHUP): the local runner first (it finishes held work until
RUNNER_DRAIN_DEADLINE_MS, then cancels the rest and stops its sandboxes), then the API and the
scheduler, then the embedded redis-server. A second Ctrl-C (a second or more after the first)
makes the runner cancel its held work at once.

A process that crashes is restarted. One that exits before it was ever up (the API's port in use,
a bad setting of its own) or that exits 5 times within a minute stops the platform, with a fatal
line naming it and its last error. The local runner exiting with code 5 (its credential revoked)
is not restarted: an error line says so, the rest runs on, and the next start gives the runner a
new credential.

One platform runs per DATA_DIR: a second start on one a live platform uses exits with code 1.
A start after a platform killed outright first waits for its processes still stopping.

Exit codes: 0 stopped by a signal; 1 a process could not start or kept crashing, another
platform runs on DATA_DIR, or another failure; 2 a bad setting (one line on stderr: PORT=abc,
LOG_LEVEL=loud, START_RUNNER=maybe), an unknown option, redis-server missing, --bootstrap-only
without REDIS_URL.
`;


const require = createRequire(import.meta.url);
const entry = (pkg: string, file: string): string => join(require.resolve(`${pkg}/package.json`), '..', 'dist', file);

async function main(): Promise<void> {
  const cli = strictCommandLine('agentplane', HELP, process.argv.slice(2), ['bootstrap-only']);
  const args = { help: cli.help, bootstrapOnly: cli.flags.has('bootstrap-only') };
  if (args.help) {
    process.stdout.write(HELP);
    return;
  }
  const config = loadPlatformConfig(process.env);
  if (args.bootstrapOnly && !config.redisUrl) {
    process.stderr.write('--bootstrap-only needs REDIS_URL (the shared Redis the other processes use)\n');
    process.exit(2);
  }
  // Written at once: a child's first line of stopping must not reach the shared stdout before
  // the platform's line saying why (a stop stage signals its children right after logging).
  const log = createLogger({ name: 'platform', level: config.logLevel, sync: true });
  mkdirSync(config.dataDir, { recursive: true, mode: 0o700 });
  // Before anything under DATA_DIR is touched: a second platform on it would stop the first's
  // redis-server and share its AOF directory.
  acquirePlatformLock(config.dataDir);

  const masterKeyFile = join(config.dataDir, 'master.key');
  if (!existsSync(masterKeyFile)) writeFileSync(masterKeyFile, randomBytes(32).toString('hex'), { mode: 0o600 });

  // Children of an earlier platform here killed outright stop within their bounds, still holding
  // the API's port and the runner's config dir: this start waits for them rather than fail on them.
  await awaitEarlierChildren(config.dataDir, log);

  let stopping = false;
  let embedded: EmbeddedRedis | undefined;
  let redisUrl = config.redisUrl;
  let writePids: () => void = () => undefined;
  if (!redisUrl) {
    const redisDir = join(config.dataDir, 'redis');
    log.info({ dir: redisDir }, 'starting embedded redis-server');
    const startRedis = async (port?: number): Promise<EmbeddedRedis> => {
      const r = await startEmbeddedRedis({ dir: redisDir, hz: config.redisHz, ...(port ? { port } : {}), onLog: (line) => log.debug({ redis: line }, 'redis') });
      // A crashed redis-server is started again on the same port and AOF; clients reconnect.
      r.process.on('exit', (code, signal) => {
        if (stopping) return;
        log.error({ code, signal }, 'embedded redis-server exited; restarting it');
        const retry = (attempt: number): void => {
          setTimeout(() => {
            startRedis(r.port).then((next) => {
              embedded = next;
              writePids();
              log.info({ port: next.port }, 'embedded redis-server is back');
            }, (err: unknown) => {
              log.error({ err: err instanceof Error ? err.message : String(err) }, 'redis-server restart failed');
              if (attempt < 10) retry(attempt + 1);
              else void shutdown(1, 'redis-server restart failed');
            });
          }, Math.min(200 * 2 ** attempt, 5000));
        };
        retry(0);
      });
      return r;
    };
    embedded = await startRedis();
    // Every process of the platform runs on this machine: they reach it by its Unix socket, which
    // costs each command about half the CPU of loopback TCP on both sides.
    redisUrl = (config.redisSocket ? embedded.socketUrl : undefined) ?? embedded.url;
  }

  const redis = connectRedis(redisUrl, { name: 'platform' });
  await waitForRedis(redis);
  const docs = new DocumentStore(redis);
  const identity = new IdentityService(docs, redis, new CredentialIndex(redis));
  const boot = await bootstrapPlatform(redis, identity);
  const baseUrl = `http://${config.host === '0.0.0.0' ? '127.0.0.1' : config.host}:${config.port}`;
  const bootstrapFile = join(config.dataDir, 'bootstrap.json');
  if (boot.root_key) {
    writeFileSync(
      bootstrapFile,
      `${JSON.stringify({ organization_id: boot.organization_id, workspace_id: boot.workspace_id, root_key: boot.root_key, base_url: baseUrl }, null, 2)}\n`,
      { mode: 0o600 },
    );
    // For the person at the terminal, on stderr: stdout carries structured log lines only.
    process.stderr.write(
      `\n  agentplane first boot\n  organization  ${boot.organization_id}\n  workspace     ${boot.workspace_id}\n` +
        `  root API key  ${boot.root_key}\n  (shown once; also saved to ${bootstrapFile}, mode 0600)\n\n`,
    );
    log.info({ organization_id: boot.organization_id, workspace_id: boot.workspace_id, bootstrap_file: bootstrapFile }, 'first boot: the root API key is in the bootstrap file');
  }
  const runnerDir = join(config.dataDir, 'runner');
  if (config.startRunner) {
    const credentials = new CredentialIndex(redis);
    await ensureLocalRunner(redis, new RunnerService(docs, redis, credentials, identity), boot.workspace_id, runnerDir, baseUrl, log);
  }
  await redis.quit();
  if (args.bootstrapOnly) {
    // A multi-node deployment's one-shot first boot (docker/compose.cluster.yaml): the processes
    // run on their own.
    log.info({ organization_id: boot.organization_id, workspace_id: boot.workspace_id }, 'bootstrap done');
    return;
  }
  if (boot.root_key) {
    // A first boot on a machine that still has sandboxes of an earlier platform says so, once:
    // counted before the local runner starts (its reaper may remove some of them soon after),
    // waiting at most 10 s for the engine.
    const looked = reportEarlierSandboxes({ runnerDir, dockerSocket: process.env.DOCKER_SOCKET, scope: config.localRunnerEnv.AGENTPLANE_SANDBOX_SCOPE, log }).catch((err: unknown) =>
      log.debug({ err: err instanceof Error ? err.message : String(err) }, 'could not look for sandboxes of an earlier platform'));
    await Promise.race([looked, new Promise<void>((resolve) => setTimeout(resolve, 10_000).unref())]);
  }

  const common: Record<string, string> = {
    REDIS_URL: redisUrl,
    MASTER_KEY_FILE: masterKeyFile,
    LOG_LEVEL: config.logLevel,
    DATA_DIR: config.dataDir,
    ...config.otelEnv,
    ...(config.docsUrl ? { DOCS_URL: config.docsUrl } : {}),
    // Where every process makes its temporary files, as the platform's own.
    ...(process.env.TMPDIR ? { TMPDIR: process.env.TMPDIR } : {}),
    // Crash tests only (packages/core/src/crash-points.ts).
    ...(process.env.AGENTPLANE_CRASH_AT ? { AGENTPLANE_CRASH_AT: process.env.AGENTPLANE_CRASH_AT } : {}),
  };
  const processesFile = join(config.dataDir, 'processes.json');
  // A process that could not start (or keeps crashing) stops the platform: restarting it would
  // only say the same thing forever while the platform looks as if it were starting.
  const onFatal = (f: FatalExit): void => {
    log.fatal({ child: f.child, code: f.code, signal: f.signal, error: f.error }, `the ${f.child} process ${f.reason}: ${f.error}; stopping the platform`);
    void shutdown(1, `the ${f.child} process ${f.reason}`);
  };
  const supervisor: Supervisor = new Supervisor(log, config.restartChildren, () => writePids(), { onFatal });
  // Written whole (temp file + rename) so a reader never sees half a file.
  writePids = () => {
    writeFileSync(`${processesFile}.tmp`, `${JSON.stringify({ platform: process.pid, redis: embedded?.process.pid, ...supervisor.pids() })}\n`);
    renameSync(`${processesFile}.tmp`, processesFile);
  };
  // In order: the runner first, while the API it reports to still runs; then the API and the
  // scheduler; the redis-server they all use last.
  let started = 0;
  const shutdown = async (code: number, reason: string): Promise<void> => {
    if (stopping) {
      // Under `npm start` one Ctrl-C arrives twice (from the terminal, and forwarded by npm): a
      // signal within a second of the first is that one. A later one is a second Ctrl-C: held
      // work is cancelled now rather than at the drain deadline.
      if (Date.now() - started < 1000) return;
      if (supervisor.hurry('runner')) log.info({ signal: reason }, 'already stopping; the local runner cancels its held work now');
      else log.info({ signal: reason }, 'already stopping');
      return;
    }
    stopping = true;
    started = Date.now();
    log.info({ reason, runner_drain_deadline_ms: config.runnerDrainDeadlineMs }, 'stopping the platform');
    await supervisor.stopStage(['runner']);
    if (config.startRunner) {
      const left = await stopRunnerSandboxes({ runnerDir, dockerSocket: process.env.DOCKER_SOCKET }).catch((err: unknown) => {
        log.debug({ err: err instanceof Error ? err.message : String(err) }, 'could not look for sandboxes the local runner left running');
        return 0;
      });
      if (left > 0) log.warn({ containers: left }, 'the local runner left sandbox containers running; killed them');
    }
    await supervisor.stopStage(['api', 'scheduler']);
    await supervisor.stopRest();
    if (embedded) {
      log.info('stopping the embedded redis-server');
      await embedded.stop();
    }
    log.info({ code, ms: Date.now() - started }, 'platform stopped');
    process.exit(code);
  };
  supervisor.start({
    name: 'api',
    script: entry('@agentplane/api', 'main.js'),
    nodeArgs: config.apiSemiSpaceMib > 0 ? [`--max-semi-space-size=${config.apiSemiSpaceMib}`] : [],
    env: {
      ...common, ...config.runnerEnv, ...config.modelEnv, ...config.leaseEnv, ...config.sessionEnv, PORT: String(config.port), HOST: config.host, PUBLIC_BASE_URL: config.publicBaseUrl ?? baseUrl,
      SHUTDOWN_GRACE_MS: String(config.shutdownGraceMs),
    },
    // The api exits on its own 10 s after its grace period; this is the bound behind it.
    stopGraceMs: config.shutdownGraceMs + 15_000,
    // Up once it listens: one that exits before (its port in use, a bad setting) could not start.
    ready: 'listen',
  });

  if (config.startScheduler) {
    supervisor.start({
      name: 'scheduler',
      script: entry('@agentplane/scheduler', 'main.js'),
      env: { ...common, ...config.leaseEnv, SCHEDULER_PORT: String(config.schedulerPort), ...(config.schedulerHost ? { SCHEDULER_HOST: config.schedulerHost } : {}), SHUTDOWN_GRACE_MS: String(config.shutdownGraceMs) },
      // The scheduler exits on its own at the end of its grace period; this is the bound behind it.
      stopGraceMs: config.shutdownGraceMs + 5_000,
      // It serves /healthz and /metrics once it started (SCHEDULER_PORT, an ephemeral port by default).
      ready: 'listen',
    });
  }

  if (config.startRunner) {
    supervisor.start({
      name: 'runner',
      script: entry('@agentplane/runner-daemon', 'cli.js'),
      // SIGTERM drains: held work may finish until the drain deadline, then it is cancelled and
      // the runner's sandboxes are stopped. A second SIGTERM cancels at once.
      args: ['start', '--config-dir', runnerDir, '--drain-deadline-ms', String(config.runnerDrainDeadlineMs)],
      env: { ...common, ...config.localRunnerEnv },
      secondSignalAfterMs: config.runnerDrainDeadlineMs + 5_000,
      runnerDir,
      stopGraceMs: config.runnerDrainDeadlineMs + 20_000,
      // Up once its startup (image check, tier canaries) is done and it serves.
      ready: 'signal',
      // Its credential refused for good (revoked): restarted, it would only be refused again. The
      // next platform start mints it a new one.
      finalExitCodes: {
        [RUNNER_EXIT.credentialRefused]: 'the control plane refused its credential (revoked?); the platform runs on without a local runner until it is started again, which gives the runner a new credential',
      },
    });
  }

  process.on('SIGINT', () => void shutdown(0, 'SIGINT'));
  process.on('SIGTERM', () => void shutdown(0, 'SIGTERM'));
  // The terminal went away: the children, in process groups of their own, are not told; stop them.
  process.on('SIGHUP', () => void shutdown(0, 'SIGHUP'));
  log.info({ url: baseUrl, dataDir: config.dataDir }, 'agentplane is starting');
}

/** File-system errors a start meets in its data directory, as a person reads them. */
const FS_CODES: ReadonlyMap<string, string> = new Map([
  ['ENOSPC', 'no space left on the device'], ['EDQUOT', 'disk quota exceeded'], ['EROFS', 'the file system is read-only'],
  ['EACCES', 'permission denied'], ['EPERM', 'operation not permitted'], ['ENOTDIR', 'a part of the path is not a directory'],
]);

main().catch((err: unknown) => {
  if (err instanceof RedisServerMissingError) {
    process.stderr.write(`${err.message}\n`);
    process.exit(2);
  }
  // Another platform runs on this data directory: one line, and it is left alone.
  if (err instanceof PlatformRunningError) {
    process.stderr.write(`agentplane failed to start: ${err.message}\n`);
    process.exit(1);
  }
  // A bad setting is one line and exit code 2, as an unknown option is (and as the runner CLI says it).
  if (err instanceof ConfigError) {
    process.stderr.write(`agentplane failed to start: ${err.message}\n`);
    process.exit(2);
  }
  // The data directory cannot be written (full, read-only, not ours): one line naming it.
  const fsErr = err as NodeJS.ErrnoException;
  if (fsErr instanceof Error && typeof fsErr.code === 'string' && FS_CODES.has(fsErr.code)) {
    process.stderr.write(`agentplane failed to start: cannot write ${fsErr.path ?? 'the data directory'} (${fsErr.code}: ${FS_CODES.get(fsErr.code)}); fix that and start again\n`);
    process.exit(1);
  }
  process.stderr.write(`agentplane failed to start: ${err instanceof Error ? (err.stack ?? err.message) : String(err)}\n`);
  process.exit(1);
});
