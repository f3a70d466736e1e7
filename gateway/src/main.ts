import { createServer } from 'node:http';
import { ApiError, ConfigError, createLogger, readSettings, createMetrics, LISTEN_BACKLOG, METRICS_CONTENT_TYPE, startTracing, strictCommandLine } from '@agentplane/core';
import { connectRedis } from '@agentplane/store';
import { RUNNER_DEFAULTS } from '@agentplane/protocol';
import { attachGateway } from './gateway.js';
import { loadGatewayConfig } from './config.js';
import { linkUrlFor } from './link.js';

const HELP = `agentplane runner gateway (standalone)

Usage: node gateway/dist/main.js [--help]

Environment:
  REDIS_URL                        Redis shared with the API (required)
  PORT, HOST                       listen address (default 8081, 127.0.0.1)
  RUNNER_HEARTBEAT_INTERVAL_MS     heartbeat interval told to runners (default ${RUNNER_DEFAULTS.heartbeatIntervalMs})
  RUNNER_PRESENCE_TTL_MS           presence TTL (default ${RUNNER_DEFAULTS.presenceTtlMs})
  RUNNER_MAX_FRAME_BYTES           largest accepted frame (default ${RUNNER_DEFAULTS.maxFrameBytes})
  GATEWAY_LINK_URL                 where schedulers reach this node's link (ws://host:port; default: the
                                   listen address, 127.0.0.1 for 0.0.0.0); off: frames come by pub/sub
  LOG_LEVEL                        fatal|error|warn|info|debug|trace|silent (default info)
  DOCS_URL                         documentation base used in error bodies (default https://docs.agentplane.dev)
  SHUTDOWN_GRACE_MS                graceful stop on SIGTERM/SIGINT; the process exits after it regardless (default 10000)

Exit codes: 0 stopped by a signal; 1 it could not start (e.g. its port in use) or its stop did not
finish in time; 2 a bad setting (one line on stderr naming it) or an unknown option.
`;


/** How long `/readyz` waits for Redis to answer a PING before it reports Redis not ready. */
const READY_TIMEOUT_MS = 1_000;

/** `node gateway/dist/main.js`: the runner gateway on its own (when the API does not embed it). */
async function main(): Promise<void> {
  if (strictCommandLine('gateway', HELP, process.argv.slice(2)).help) {
    process.stdout.write(HELP);
    return;
  }
  const config = readSettings(() => loadGatewayConfig(process.env));
  const { graceMs, linkUrl, port, host } = config;
  const log = createLogger({ name: 'gateway', level: config.logLevel });
  const tracing = await startTracing('agentplane-gateway', log, { propagation: 'explicit' });
  const redis = connectRedis(config.redisUrl, { name: 'gateway' });
  redis.on('error', (err: Error) => log.warn({ err: err.message }, 'redis connection error'));
  const metrics = createMetrics();
  // The error body of the API's catalog, its `more` link included.
  let stopping = false;
  let pinging: Promise<boolean> | null = null;
  /** Whether Redis answers a PING within READY_TIMEOUT_MS; probes meanwhile share the PING. */
  const redisAnswers = (): Promise<boolean> => {
    if (pinging) return pinging;
    let timer: NodeJS.Timeout | undefined;
    const late = new Promise<boolean>((resolve) => {
      timer = setTimeout(() => resolve(false), READY_TIMEOUT_MS);
      timer.unref();
    });
    const current = Promise.race([redis.ping().then((r) => r === 'PONG', () => false), late]).finally(() => {
      clearTimeout(timer);
      if (pinging === current) pinging = null;
    });
    pinging = current;
    return current;
  };
  const notFound = JSON.stringify(new ApiError('validation.not_found', 'the gateway serves /v1/runners/connect, /healthz, /readyz and /metrics').toWire(config.docsUrl));
  const server = createServer((req, res) => {
    if (req.url === '/healthz') {
      res.writeHead(200, { 'content-type': 'application/json' }).end('{"status":"ok"}');
    } else if (req.url === '/readyz') {
      // Readiness: Redis answers a PING within READY_TIMEOUT_MS (runner routing, presence and revocations go through it).
      const answer = (status: number, body: unknown) => res.writeHead(status, { 'content-type': 'application/json', 'cache-control': 'no-store' }).end(JSON.stringify(body));
      if (stopping) answer(503, { status: 'stopping', not_ready: ['stopping'] });
      else void redisAnswers().then((ok) => (ok ? answer(200, { status: 'ready' }) : answer(503, { status: 'not_ready', not_ready: ['redis'] })));
    } else if (req.url === '/metrics') {
      metrics.metrics().then(
        (text) => res.writeHead(200, { 'content-type': METRICS_CONTENT_TYPE }).end(text),
        (err: unknown) => {
          log.error({ err }, 'metrics collection failed');
          res.writeHead(500).end();
        },
      );
    } else {
      res.writeHead(404, { 'content-type': 'application/json' }).end(notFound);
    }
  });
  const gw = attachGateway(server, {
    redis, log, metrics,
    options: config.runners,
  });
  await new Promise<void>((r) => server.listen({ port, host, backlog: LISTEN_BACKLOG }, () => r()));
  const addr = server.address();
  if (linkUrl !== null) gw.advertiseLink(linkUrlFor(host, typeof addr === 'object' && addr ? addr.port : port, linkUrl));
  log.info({ port: typeof addr === 'object' && addr ? addr.port : port }, 'gateway listening');
  if (process.send) process.send({ ready: true, port: typeof addr === 'object' && addr ? addr.port : port });
  const stop = async (signal: string) => {
    if (stopping) return;
    stopping = true;
    const started = Date.now();
    log.info({ signal }, 'gateway shutting down');
    // A stop that cannot finish (Redis gone) must not keep the process alive.
    setTimeout(() => {
      log.warn({ after_ms: graceMs }, 'shutdown did not finish in time; exiting');
      process.exit(1);
    }, graceMs).unref();
    await gw.close();
    server.close();
    await redis.quit().catch(() => redis.disconnect());
    await tracing.shutdown();
    log.info({ ms: Date.now() - started }, 'gateway stopped');
    process.exit(0);
  };
  process.on('SIGTERM', () => void stop('SIGTERM'));
  process.on('SIGINT', () => void stop('SIGINT'));
}

main().catch((err: unknown) => {
  // One line either way; a bad setting is exit code 2, as for the platform and the runner CLI.
  process.stderr.write(`gateway failed to start: ${err instanceof Error ? err.message : String(err)}\n`);
  process.exit(err instanceof ConfigError ? 2 : 1);
});
