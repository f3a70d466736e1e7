import { createServer, type Server } from 'node:http';
import { BUCKETS, Counter, createMetrics, Gauge, Histogram, METRICS_CONTENT_TYPE, type Logger, type Metrics } from '@agentplane/core';

/** How a lease this runner was offered ended (a closed set). */
export type LeaseOutcome = 'rejected' | 'completed' | 'failed_work' | 'failed_infrastructure';

/**
 * The daemon's Prometheus metrics (served only when RUNNER_METRICS_ADDR is set): leases by
 * outcome and how long they were held, sandbox preparation time, and the runtime defaults. The
 * runtime defaults are collected only when served (`served`): their event-loop monitor would
 * otherwise wake an idle runner 100 times a second for nobody.
 */
export class RunnerMetrics {
  readonly registry: Metrics;
  readonly leases: Counter<'outcome'>;
  readonly leaseSeconds: Histogram;
  readonly sandboxStartSeconds: Histogram<'driver'>;
  readonly connected: Gauge;
  readonly dockerUp: Gauge;
  readonly tierVerified: Gauge<'tier'>;
  readonly sandboxDriver: Gauge<'driver'>;
  readonly egressConnections: Counter<'outcome'>;

  constructor(held: () => number, options: { served: boolean } = { served: true }) {
    const registry = (this.registry = createMetrics({ runtime: options.served }));
    this.leases = new Counter({
      name: 'agentplane_runner_leases_total', help: 'Lease offers this runner handled, by outcome (rejected, completed, failed_work, failed_infrastructure)',
      labelNames: ['outcome'] as const, registers: [registry],
    });
    this.leaseSeconds = new Histogram({
      name: 'agentplane_runner_lease_duration_seconds', help: 'Accepted lease → completed or failed (one turn) on this runner',
      buckets: [...BUCKETS.lease], registers: [registry],
    });
    this.sandboxStartSeconds = new Histogram({
      name: 'agentplane_runner_sandbox_start_seconds', help: 'Sandbox created or resumed and its resources materialised, before a turn, by driver (docker, process)',
      labelNames: ['driver'] as const, buckets: [...BUCKETS.sandboxStart], registers: [registry],
    });
    this.connected = new Gauge({ name: 'agentplane_runner_connected', help: '1 while the runner holds a live connection to the control plane', registers: [registry] });
    this.dockerUp = new Gauge({ name: 'agentplane_runner_docker_up', help: '1 when the Docker engine answered its last check, 0 when it did not', registers: [registry] });
    this.tierVerified = new Gauge({
      name: 'agentplane_runner_isolation_tier_verified', help: '1 for each isolation tier (container, gvisor) offered now: its canary sandbox ran at the last check',
      labelNames: ['tier'] as const, registers: [registry],
    });
    this.sandboxDriver = new Gauge({
      name: 'agentplane_runner_sandbox_driver_info', help: 'The sandbox driver in use (docker, process): 1 for it, 0 for the other',
      labelNames: ['driver'] as const, registers: [registry],
    });
    this.egressConnections = new Counter({
      name: 'agentplane_runner_egress_connections_total',
      help: 'Connections sandboxes of allowlist Environments made through the egress proxy, by outcome (connected, refused: not listed or a private address, failed: listed and not reachable)',
      labelNames: ['outcome'] as const, registers: [registry],
    });
    new Gauge({ name: 'agentplane_runner_held_leases', help: 'Leases this runner holds now', registers: [registry], collect() { this.set(held()); } });
  }
}

/** `host:port`, `:port` or a bare port → listen arguments. */
export function parseListenAddress(addr: string): { host: string; port: number } {
  const m = /^(?:(.*):)?(\d{1,5})$/.exec(addr.trim());
  const port = m ? Number(m[2]) : NaN;
  if (!m || port > 65535) throw new Error(`RUNNER_METRICS_ADDR must be host:port, :port or a port (got ${JSON.stringify(addr)})`);
  const host = (m[1] ?? '').replace(/^\[(.*)\]$/, '$1');
  return { host: host === '' ? '127.0.0.1' : host, port };
}

/** What GET /healthz answers: its status code and JSON body. */
export type HealthProbe = () => Promise<{ code: number; body: unknown }>;

/** Serve GET /metrics and GET /healthz (200 when `health` says so, 503 otherwise) on the given address. */
export async function serveMetrics(registry: Metrics, addr: string, log: Logger, health?: HealthProbe): Promise<Server> {
  const { host, port } = parseListenAddress(addr);
  const server = createServer((req, res) => {
    if (req.url === '/metrics' && req.method === 'GET') {
      registry.metrics().then(
        (text) => res.writeHead(200, { 'content-type': METRICS_CONTENT_TYPE }).end(text),
        (err: unknown) => {
          log.error({ err }, 'metrics collection failed');
          res.writeHead(500).end();
        },
      );
    } else if (req.url === '/healthz' && req.method === 'GET') {
      (health ?? (() => Promise.resolve({ code: 200, body: { status: 'ok' } })))().then(
        (h) => res.writeHead(h.code, { 'content-type': 'application/json', 'cache-control': 'no-store' }).end(JSON.stringify(h.body)),
        (err: unknown) => {
          log.error({ err }, 'health check failed');
          res.writeHead(500).end();
        },
      );
    } else res.writeHead(404).end();
  });
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(port, host, () => resolve());
  });
  const a = server.address();
  log.info({ host, port: typeof a === 'object' && a ? a.port : port }, 'runner metrics listening');
  return server;
}
