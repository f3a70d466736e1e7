import { ConfigError, createLogger, readSettings, startTracing, strictCommandLine } from '@agentplane/core';
import { createApi } from './app.js';
import { loadApiConfig } from './config.js';

const HELP = `agentplane API server

Usage: node api/dist/main.js [--help]

Environment:
  REDIS_URL          Redis to use (required)
  PORT, HOST         listen address (default 8080, 127.0.0.1)
  MASTER_KEY[_FILE]  32-byte key that seals secrets at rest (required)
  DOCS_URL           documentation base used in error bodies (default https://docs.agentplane.dev)
  PUBLIC_BASE_URL    URL clients use to reach this API (default http://HOST:PORT)
  LOG_LEVEL          fatal|error|warn|info|debug|trace|silent (default info)
  GATEWAY_EMBEDDED   host the runner WebSocket gateway on /v1/runners/connect (default true)
  GATEWAY_LINK_URL   where schedulers reach this node's link (ws://host:port; default: the listen
                     address, 127.0.0.1 for 0.0.0.0); off: frames for runners come by Redis pub/sub
  RUNNER_HEARTBEAT_INTERVAL_MS, RUNNER_PRESENCE_TTL_MS, RUNNER_MAX_FRAME_BYTES
                     runner heartbeat interval (5000), presence TTL (20000), largest frame (1 MiB)
  PAIRING_REDEEM_PER_MINUTE  pairing-code redemptions accepted per minute per client address (60; ten times that platform-wide)
  SHUTDOWN_GRACE_MS  graceful stop on SIGTERM/SIGINT: open requests and streams get this long;
                     the process exits 10 s after it regardless (default 10000)
  OTEL_*             OpenTelemetry tracing, off by default: OTEL_TRACES_EXPORTER=otlp or
                     OTEL_EXPORTER_OTLP_ENDPOINT turns on OTLP/HTTP export (docs/OPERATIONS.md)
  More settings (leases, models, automations, webhooks, audit, memory, limits): the README's
  settings table and docs/OPERATIONS.md ("Other settings").

Exit codes: 0 stopped by a signal; 1 it could not start (e.g. its port in use) or its stop failed;
2 a bad setting (one line on stderr naming it) or an unknown option.
`;



/** `node api/dist/main.js`: one API process (REST, SSE, MCP, and by default the runner gateway). */
async function main(): Promise<void> {
  if (strictCommandLine('api', HELP, process.argv.slice(2)).help) {
    process.stdout.write(HELP);
    return;
  }
  const config = readSettings(() => loadApiConfig(process.env));
  const log = createLogger({ name: 'api', level: config.logLevel });
  for (const { name, use } of config.deprecatedSettings ?? []) log.warn({ setting: name, use }, `${name} is deprecated; set ${use} instead`);
  const tracing = await startTracing('agentplane-api', log, { propagation: 'explicit' });
  const api = createApi(config, log);
  const { port } = await api.listen();
  log.info({ port, host: config.host }, 'api listening');
  let stopping = false;
  const stop = (signal: string) => {
    if (stopping) return;
    stopping = true;
    const started = Date.now();
    log.info({ signal }, 'api shutting down');
    // A graceful stop that cannot finish (Redis gone while BullMQ workers close) must not keep
    // the process alive: after the grace period and 10 s more it exits anyway.
    const hard = setTimeout(() => {
      log.warn({ after_ms: config.shutdownGraceMs + 10_000 }, 'shutdown did not finish in time; exiting');
      process.exit(1);
    }, config.shutdownGraceMs + 10_000);
    hard.unref();
    api.close().then(tracing.shutdown).then(
      () => {
        log.info({ ms: Date.now() - started }, 'api stopped');
        process.exit(0);
      },
      (err: unknown) => {
        log.error({ err }, 'api shutdown failed');
        process.exit(1);
      },
    );
  };
  process.on('SIGINT', () => stop('SIGINT'));
  process.on('SIGTERM', () => stop('SIGTERM'));
}

main().catch((err: unknown) => {
  // One line either way; a bad setting is exit code 2, as for the platform and the runner CLI.
  process.stderr.write(`api failed to start: ${err instanceof Error ? err.message : String(err)}\n`);
  process.exit(err instanceof ConfigError ? 2 : 1);
});
