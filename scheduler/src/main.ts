import { createServer } from 'node:http';
import { createLogger, METRICS_CONTENT_TYPE, startTracing } from '@agentplane/core';
import { loadSchedulerConfig } from './config.js';
import { Scheduler } from './scheduler.js';

const HELP = `agentplane scheduler: places Runs on runners (BullMQ lease engine)

Usage: node scheduler/dist/main.js

Environment:
  REDIS_URL            Redis to use (required)
  LEASE_MS             lease length (default 30000); runners renew every third
  OFFER_TIMEOUT_MS     time a runner has to accept an offer (default 5000)
  MAX_OFFERS           offers per dispatch before the Run waits (default 3)
  RUN_MAX_ATTEMPTS     leases a Run may fail with infrastructure errors (default 5)
  RUN_BACKOFF_MS       first retry delay, doubling (default 1000)
  RUN_MAX_LOST_LEASES  lost leases a Run survives (default 3)
  STALLED_INTERVAL_MS  how often expired leases are detected (default 5000)
  POOL_SCAN_MS         how often pools, finished jobs and interrupted enqueues are swept (default 1000)
  ENQUEUE_REPAIR_AFTER_MS  a started Run not in its queue after this long is enqueued (default 10000)
  SCHEDULER_PORT       serve /healthz and /metrics here (0 = ephemeral; unset = off)
  LOG_LEVEL            fatal|error|warn|info|debug|trace|silent
  OTEL_*               OpenTelemetry tracing, off by default: OTEL_TRACES_EXPORTER=otlp or
                       OTEL_EXPORTER_OTLP_ENDPOINT turns on OTLP/HTTP export (docs/OPERATIONS.md)
`;

async function main(): Promise<void> {
  if (process.argv.includes('--help') || process.argv.includes('-h')) {
    process.stdout.write(HELP);
    return;
  }
  const config = loadSchedulerConfig(process.env);
  const log = createLogger({ name: 'scheduler', level: config.logLevel });
  const tracing = await startTracing('agentplane-scheduler', log, { propagation: 'explicit' });
  const scheduler = new Scheduler(config, log);
  await scheduler.start();
  let stopping = false;
  const server = config.port === undefined ? undefined : createServer((req, res) => {
    if (req.url === '/healthz') {
      res.writeHead(stopping ? 503 : 200, { 'content-type': 'application/json' }).end(JSON.stringify({ status: stopping ? 'stopping' : 'ok' }));
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
    log.info({ signal }, 'scheduler shutting down');
    server?.close();
    scheduler.stop().then(tracing.shutdown).then(() => process.exit(0), (err: unknown) => {
      log.error({ err }, 'scheduler shutdown failed');
      process.exit(1);
    });
  };
  process.on('SIGINT', () => stop('SIGINT'));
  process.on('SIGTERM', () => stop('SIGTERM'));
}

main().catch((err: unknown) => {
  process.stderr.write(`scheduler failed to start: ${err instanceof Error ? (err.stack ?? err.message) : String(err)}\n`);
  process.exit(1);
});
