import { createServer, type Server } from 'node:http';
import Koa from 'koa';
import { createLogger, Metrics, SecretBox, type Logger } from '@agentplane/core';
import { connectRedis, DocumentStore, type Redis } from '@agentplane/store';
import type { ApiConfig } from './config.js';
import type { ApiDeps } from './deps.js';
import { IdempotencyStore } from './http/idempotency.js';
import { buildRouter, errorBoundary, unmatchedRoute } from './http/router.js';
import { mcpEdge } from './mcp/edge.js';
import { runtimeMcp } from './mcp/runtime.js';
import { RedisRuntimeBearers } from './mcp/runtime-bearer.js';
import { CredentialIndex } from './identity/credentials.js';
import { IdentityService } from './identity/service.js';
import { allOperations } from './routes.js';

export interface ApiServer {
  server: Server;
  deps: ApiDeps;
  /** Abort signal that fires when shutdown begins (long-lived streams end on it). */
  shutdownSignal: AbortSignal;
  listen(): Promise<{ port: number }>;
  close(): Promise<void>;
}

export function buildDeps(config: ApiConfig, log: Logger, redis: Redis): ApiDeps {
  const docs = new DocumentStore(redis);
  const credentials = new CredentialIndex(redis);
  const secretBox = new SecretBox(config.masterKey);
  return {
    config,
    redis,
    docs,
    credentials,
    secretBox,
    idempotency: new IdempotencyStore(redis, secretBox, config.idempotencyTtlSeconds),
    identity: new IdentityService(docs, redis, credentials),
    metrics: new Metrics(),
    log,
  };
}

export function createApi(config: ApiConfig, log: Logger = createLogger({ name: 'api', level: config.logLevel })): ApiServer {
  const redis = connectRedis(config.redisUrl, { name: 'api' });
  redis.on('error', (err) => log.warn({ err: err.message }, 'redis connection error'));
  const deps = buildDeps(config, log, redis);
  const shutdown = new AbortController();
  const operations = allOperations();
  const { router, prepared } = buildRouter(operations, deps);

  const app = new Koa({ proxy: false });
  app.silent = true;
  app.use(errorBoundary(deps));
  app.use(async (ctx, next) => {
    if (ctx.path === '/healthz' && ctx.method === 'GET') {
      ctx.body = { status: shutdown.signal.aborted ? 'stopping' : 'ok' };
      ctx.status = shutdown.signal.aborted ? 503 : 200;
      return;
    }
    if (ctx.path === '/metrics' && ctx.method === 'GET' && config.metricsEnabled) {
      ctx.type = 'text/plain; version=0.0.4';
      ctx.body = deps.metrics.render();
      return;
    }
    await next();
  });
  app.use(mcpEdge(operations, prepared, deps).middleware);
  app.use(runtimeMcp(deps, { verifier: new RedisRuntimeBearers(redis) }));
  app.use(router.routes());
  app.use(unmatchedRoute(router));

  const server = createServer({ keepAliveTimeout: 65_000, requestTimeout: 0, headersTimeout: 30_000 }, app.callback());

  return {
    server,
    deps,
    shutdownSignal: shutdown.signal,
    listen: () =>
      new Promise((resolve, reject) => {
        server.once('error', reject);
        server.listen(config.port, config.host, () => {
          const addr = server.address();
          resolve({ port: typeof addr === 'object' && addr ? addr.port : config.port });
        });
      }),
    async close() {
      shutdown.abort();
      await new Promise<void>((resolve) => {
        const timer = setTimeout(() => {
          server.closeAllConnections();
          resolve();
        }, config.shutdownGraceMs);
        timer.unref();
        server.close(() => {
          clearTimeout(timer);
          resolve();
        });
        server.closeIdleConnections();
      });
      await redis.quit().catch(() => redis.disconnect());
    },
  };
}
