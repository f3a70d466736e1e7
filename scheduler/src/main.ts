import { createServer } from 'node:http';
import { ConfigError, createLogger, readSettings, METRICS_CONTENT_TYPE, startTracing, strictCommandLine } from '@agentplane/core';
import { loadSchedulerConfig } from './config.js';
import { Scheduler } from './scheduler.js';

const HELP = `agentplane scheduler: places Runs on runners (BullMQ lease engine)

Usage: node scheduler/dist/main.js [--help]

Environment:
  REDIS_URL            Redis to use (required)
  LEASE_MS             lease length (default 30000); runners renew every third
  LEASE_HEARTBEAT_MS   how often a lease is renewed (default a third of LEASE_MS)
  FENCE_MARGIN_MS      how much earlier than the lease a Session's fence expires (default 1000, at most LEASE_MS/4)
  OFFER_TIMEOUT_MS     time a runner has to accept an offer (default 5000)
  MAX_OFFERS           offers per dispatch before the Run waits (default 3)
  RUN_MAX_ATTEMPTS     leases a Run may fail with infrastructure errors (default 5)
  RUN_BACKOFF_MS       first retry delay, doubling (default 1000)
  RUN_MAX_LOST_LEASES  lost leases a Run survives (default 3)
  STALLED_INTERVAL_MS  how often expired leases are detected (default 5000)
  POOL_IDLE_MS         a pool with no Run queued for this long and an empty queue is no longer
                       dispatched (default 300000; set the same value on the API)
  POOL_SCAN_MS         how often pools, finished jobs and interrupted enqueues are swept (default 1000)
  CAPACITY_RETRY_MS    how long a Run no runner can take now waits before it is tried again (default 1000)
  ENQUEUE_REPAIR_AFTER_MS  a started Run not in its queue after this long is enqueued (default 10000)
  INTERRUPT_GRACE_MS   how long a Run interrupted on its runner gets to stop before it is cancelled (default 10000)
  MASTER_KEY[_FILE]    the platform master key (32 bytes, hex or base64); without it Runs of agents
                       with MCP servers get no MCP tools
  EVENT_APPEND_WAIT_REPLICAS, EVENT_APPEND_WAIT_TIMEOUT_MS
                       WAIT for replicas after each Session event append (default off; docs/CLUSTER.md)
  GATEWAY_LINKS        send runners' frames over direct links to the gateway nodes that advertise
                       one (default true; false: through Redis pub/sub only)
  SCHEDULER_PORT       serve /healthz, /readyz and /metrics here (0 = ephemeral; unset = off)
  SCHEDULER_HOST       address /healthz, /readyz and /metrics listen on (default 127.0.0.1)
  SHUTDOWN_GRACE_MS    graceful stop on SIGTERM/SIGINT; the process exits after it regardless (default 10000)
  LOG_LEVEL            fatal|error|warn|info|debug|trace|silent (default info)
  OTEL_*               OpenTelemetry tracing, off by default: OTEL_TRACES_EXPORTER=otlp or
                       OTEL_EXPORTER_OTLP_ENDPOINT turns on OTLP/HTTP export (docs/OPERATIONS.md)

Exit codes: 0 stopped by a signal; 1 it could not start or its stop failed; 2 a bad setting (one
line on stderr naming it) or an unknown option.
`;



/** How long `/readyz` waits for Redis to answer a PING before it reports Redis not ready. */
const READY_TIMEOUT_MS = 1_000;

async function main(): Promise<void> {
  if (strictCommandLine('scheduler', HELP, process.argv.slice(2)).help) {
    process.stdout.write(HELP);
    return;
  }
  const config = readSettings(() => loadSchedulerConfig(process.env));
  const log = createLogger({ name: 'scheduler', level: config.logLevel });
  const tracing = await startTracing('agentplane-scheduler', log, { propagation: 'explicit' });
  const scheduler = new Scheduler(config, log);
  await scheduler.start();
  let stopping = false;
  const server = config.port === undefined ? undefined : createServer((req, res) => {
    if (req.url === '/healthz') {
      res.writeHead(stopping ? 503 : 200, { 'content-type': 'application/json' }).end(JSON.stringify({ status: stopping ? 'stopping' : 'ok' }));
    } else if (req.url === '/readyz') {
      // Readiness: Redis answers a PING within READY_TIMEOUT_MS and the queue and offer connections are up.
      const answer = (status: number, body: unknown) => res.writeHead(status, { 'content-type': 'application/json', 'cache-control': 'no-store' }).end(JSON.stringify(body));
      if (stopping) answer(503, { status: 'stopping', not_ready: ['stopping'] });
      else {
        scheduler.notReady(READY_TIMEOUT_MS).then(
          (failing) => (failing.length === 0 ? answer(200, { status: 'ready' }) : answer(503, { status: 'not_ready', not_ready: failing })),
          () => answer(503, { status: 'not_ready', not_ready: ['redis'] }),
        );
      }
    } else if (req.url === '/metrics') {
      scheduler.metrics.registry.metrics().then(
        (text) => res.writeHead(200, { 'content-type': METRICS_CONTENT_TYPE }).end(text),
        (err: unknown) => {
          log.error({ err }, 'metrics collection failed');
          res.writeHead(500).end();
        },
      );
    } else res.writeHead(404).end();
  });
  server?.listen(config.port, config.host, () => {
    const addr = server.address();
    log.info({ port: typeof addr === 'object' && addr ? addr.port : config.port }, 'scheduler metrics listening');
  });
  const stop = (signal: string) => {
    if (stopping) return;
    stopping = true;
    const started = Date.now();
    log.info({ signal }, 'scheduler shutting down');
    // A graceful stop that cannot finish (BullMQ's close waits on a Redis that is gone) must not
    // keep the process alive: after the grace period it exits anyway.
    setTimeout(() => {
      log.warn({ after_ms: config.shutdownGraceMs }, 'shutdown did not finish in time; exiting');
      process.exit(1);
    }, config.shutdownGraceMs).unref();
    server?.close();
    scheduler.stop().then(tracing.shutdown).then(() => {
      log.info({ ms: Date.now() - started }, 'scheduler stopped');
      process.exit(0);
    }, (err: unknown) => {
      log.error({ err }, 'scheduler shutdown failed');
      process.exit(1);
    });
  };
  process.on('SIGINT', () => stop('SIGINT'));
  process.on('SIGTERM', () => stop('SIGTERM'));
}

main().catch((err: unknown) => {
  // A setting's mistake is one line and exit code 2 (as for the platform and the runner CLI);
  // anything else keeps its stack and is exit code 1.
  const text = err instanceof ConfigError ? err.message : err instanceof Error ? (err.stack ?? err.message) : String(err);
  process.stderr.write(`scheduler failed to start: ${text}\n`);
  process.exit(err instanceof ConfigError ? 2 : 1);
});
