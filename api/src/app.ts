import { OutcomeService } from '@agentplane/domain';
import { createServer, type Server } from 'node:http';
import type { Duplex } from 'node:stream';
import Koa from 'koa';
import { ApiError, createLogger, createMetrics, Counter, Gauge, LISTEN_BACKLOG, METRICS_CONTENT_TYPE, newRequestId, SecretBox, type Logger } from '@agentplane/core';
import { connectRedis, DocumentStore, EventHub, ReadCache, type Redis } from '@agentplane/store';
import type { Agent } from '@agentplane/domain';
import { VersionedStore } from '@agentplane/domain';
import type { Environment } from '@agentplane/domain';
import { FileStore } from '@agentplane/domain';
import { MemoryService } from './memory/service.js';
import { VaultService } from './vaults/service.js';
import { runtimeGitCredentials } from './vaults/runtime.js';
import { ProjectService } from './projects/service.js';
import { runtimeProjects } from './projects/runtime.js';
import { SkillService } from './skills/service.js';
import { runtimeSkills } from './skills/runtime.js';
import { SkillSourceService } from './skill-sources/service.js';
import { removeStaleScratch } from './skill-sources/git.js';
import { ToolSourceService } from './tool-sources/service.js';
import { A2aToolCalls } from './tool-sources/calls.js';
import { runtimeToolSource } from './tool-sources/runtime.js';
import { SkillProposalService } from './skill-proposals/service.js';
import { runtimeMemory } from './memory/runtime.js';
import { AuditLog } from './audit/store.js';
import { PermissionStore } from './governance/permissions.js';
import { PolicyStore } from './governance/policies.js';
import { registerSandboxRelease } from './runs/sandbox-release.js';
import { runtimeFiles } from './files/runtime.js';
import { SessionService } from './sessions/service.js';
import { SessionStore } from '@agentplane/domain';
import { recordOnlyTurnScheduler, ThreadRuntime, type TurnScheduler } from '@agentplane/domain';
import { activeStreams, queuedStreamBytes, streamCutOffs } from './sessions/stream.js';
import type { ApiConfig } from './config.js';
import type { ApiDeps } from './deps.js';
import { IdempotencyStore } from './http/idempotency.js';
import { buildRouter, requestBoundary, unmatchedRoute } from './http/router.js';
import { MCP_PATH, mcpEdge } from './mcp/edge.js';
import { a2aEdge } from './a2a/edge.js';
import { runtimeMcp } from './mcp/runtime.js';
import { DelayedJobs, LeaseFence } from '@agentplane/lease';
import { ApprovalService, type ApprovalJob } from './approvals/service.js';
import { CredentialIndex, IdentityService, RedisRuntimeBearers } from '@agentplane/domain';
import { allOperations } from './routes.js';
import { RunnerService } from '@agentplane/domain';
import { createRunsModule } from './runs/module.js';
import { registerRunHandlers } from './runs/gateway-handlers.js';
import { attachGateway, linkUrlFor, PresenceStore, type Gateway } from '@agentplane/gateway';
import { createModelsModule } from './models/module.js';
import { CONSOLE_PREFIX, consoleStatic } from './console/static.js';
import { AutomationService } from './automations/service.js';
import { AutomationStore } from './automations/store.js';
import { WebhookDispatcher } from './webhooks/delivery.js';
import { ToolSourceMigrations } from './tool-sources/migrations.js';
import { WebhookStore } from './webhooks/store.js';
import { SessionEventTap } from './events/tap.js';
import { registerRedisMetrics } from './observability/redis-metrics.js';
import { readinessCheck } from './observability/readiness.js';
import { SurfaceScopeStore } from './surface-scopes/store.js';
import { AgentInstallationStore } from './installations/store.js';

export interface ApiServer {
  server: Server;
  deps: ApiDeps;
  /** The embedded runner gateway (null when GATEWAY_EMBEDDED=false). */
  gateway: Gateway | null;
  /** Abort signal that fires when shutdown begins (long-lived streams end on it). */
  shutdownSignal: AbortSignal;
  listen(): Promise<{ port: number }>;
  close(): Promise<void>;
}

export function buildDeps(config: ApiConfig, log: Logger, redis: Redis, shutdownSignal: AbortSignal = new AbortController().signal): ApiDeps {
  const docs = new DocumentStore(redis);
  // Hot keys read on every request (credentials, tenancy, Principals, Sessions, policy versions),
  // kept in-process and invalidated by Redis itself (docs/ARCHITECTURE.md, "The read cache").
  const reads = new ReadCache(redis, { onError: (err) => log.warn({ err: err.message }, 'read cache off until Redis is back') });
  void reads.start();
  const credentials = new CredentialIndex(redis);
  const secretBox = new SecretBox(config.masterKey);
  const metrics = createMetrics();
  const models = createModelsModule({
    redis, docs, secretBox, log, metrics,
    config: { pricesFile: config.modelPricesFile, providerTimeoutMs: config.modelProviderTimeoutMs, stepDeadlineMs: config.modelStepDeadlineMs },
  });
  const identity = new IdentityService(docs, redis, credentials);
  const turns: { scheduler: TurnScheduler } = { scheduler: recordOnlyTurnScheduler };
  const sessionStore = new SessionStore(redis, config.appendDurability);
  const threadRuntime = new ThreadRuntime(sessionStore, () => turns.scheduler);
  const agents = new VersionedStore<Agent>(redis, 'agents', 'agent');
  const environments = new VersionedStore<Environment>(redis, 'environments', 'environment');
  const subscriber = redis.duplicate({ connectionName: 'agentplane:api:events', maxRetriesPerRequest: null });
  subscriber.on('error', (err: Error) => log.warn({ err: err.message }, 'event hub connection error'));
  const files = new FileStore(redis, docs);
  const memory = new MemoryService(redis, docs, { maxIndexedStores: config.memoryIndexedStores });
  const vaults = new VaultService(docs, secretBox);
  const projects = new ProjectService(redis, docs);
  const skills = new SkillService(redis, docs);
  const skillSources = new SkillSourceService(docs, config.skillSourcesAllowLocal, config.webhooks.egress);
  const a2aCalls = new A2aToolCalls(redis, sessionStore.log, { ...config.a2aTools.calls, egress: config.webhooks.egress, callbackBaseUrl: config.publicBaseUrl });
  const toolSources = new ToolSourceService(docs, { egress: config.webhooks.egress, cardTimeoutMs: config.a2aTools.cardTimeoutMs });
  const toolSourceMigrations = new ToolSourceMigrations({ redisUrl: config.redisUrl, redis, service: toolSources, logger: log, settings: config.a2aTools.migrations });
  toolSources.useMigrations(toolSourceMigrations);
  const audit = new AuditLog(redis, config.auditRetentionMs);
  const runners = new RunnerService(docs, redis, credentials, identity);
  const runs = createRunsModule({ config, redis, log, store: sessionStore, runtime: threadRuntime, environments, runners });
  turns.scheduler = runs.engine;
  const outcomes = new OutcomeService({
    store: sessionStore, runtime: threadRuntime, scheduler: () => turns.scheduler, log, files,
    hasProfile: async (ws, key) => (await models.profiles.resolve(ws, key)) !== null,
  });
  threadRuntime.onTurnEnded((session, threadId, runId, stop, trace, activeOutcome) => outcomes.turnEnded(session, threadId, runId, stop, trace, activeOutcome));
  const eventHub = new EventHub(subscriber);
  hubConnections.set(eventHub, subscriber);
  const policies = new PolicyStore(redis, docs, audit, log);
  // Approval expiries are BullMQ delayed jobs (their own never-give-up connection).
  const approvalJobs = new DelayedJobs<ApprovalJob>('approvals', connectRedis(config.redisUrl, { name: 'api:approvals', blocking: true }));
  const approvals = new ApprovalService({
    redis, docs, audit, policies, sessions: sessionStore, scheduler: () => turns.scheduler, jobs: approvalJobs, config: config.approvals, log,
  });
  threadRuntime.onWaitsEnded((session, _threadId, toolUseIds) => approvals.lapse(session.workspace_id, session.id, toolUseIds));
  const sessions = new SessionService({
    store: sessionStore, agents, environments, identity, files, memory: memory.stores, vaults, projects, runtime: threadRuntime, scheduler: () => turns.scheduler, outcomes,
    requireModel: (ws, key, field) => models.profiles.requireKey(ws, key, field),
    checkSkills: (ws, selections, field) => skills.checkSelections(ws, selections, field),
    admitTurn: (session) => models.budgets.check({ workspace_id: session.workspace_id, session_id: session.id, session_budget: session.budget }),
    modelUsage: async (scope) => {
      const r = await models.usage.read(scope.thread_id ? { kind: 'thread', session_id: scope.session_id, thread_id: scope.thread_id } : { kind: 'session', session_id: scope.session_id });
      return r.steps > 0 ? r.usage : null;
    },
  });
  const permissions = new PermissionStore(redis, docs);
  const tap = new SessionEventTap({ hub: eventHub, docs, log: sessionStore.log, logger: log });
  const automations = new AutomationService({
    redisUrl: config.redisUrl, store: new AutomationStore(redis, docs, secretBox), sessions, identity, permissions, policies, log, metrics,
    sweepIntervalMs: config.automationSweepMs, tap, missedAfterMs: config.automationMissedAfterMs,
  });
  const webhooks = new WebhookDispatcher({
    redisUrl: config.redisUrl, redis, store: new WebhookStore(redis, docs, secretBox), log: sessionStore.log, tap, logger: log, metrics, settings: config.webhooks,
    onDisabled: (e) => automations.endpointDisabled(e),
  });
  const skillProposals = new SkillProposalService({
    redisUrl: config.redisUrl, redis, docs, sessions, models, skills, sources: skillSources, tap, identity, log, adoptionPollMs: config.skillAdoptionPollMs,
  });
  new Gauge({ name: 'agentplane_sse_streams', help: 'Session SSE streams open in this process', registers: [metrics], collect() { this.set(activeStreams()); } });
  new Gauge({ name: 'agentplane_sse_queued_bytes', help: 'Bytes written to this process\'s SSE streams and not yet sent (at most 8 MiB per viewer)', registers: [metrics], collect() { this.set(queuedStreamBytes()); } });
  new Counter({
    name: 'agentplane_sse_cut_off_total', help: 'SSE streams this process cut off, by reason (behind: 8 MiB due to the viewer; stalled: nothing read for 30 s)', labelNames: ['reason'] as const, registers: [metrics],
    collect() {
      this.reset();
      for (const [reason, n] of Object.entries(streamCutOffs())) this.inc({ reason }, n);
    },
  });
  registerRedisMetrics(metrics, redis, log);
  new Gauge({ name: 'agentplane_event_hub_channels', help: 'Session channels some viewer of this process watches', registers: [metrics], collect() { this.set(eventHub.channelCount); } });
  return {
    runs,
    files,
    memory,
    vaults,
    projects,
    skills,
    skillSources,
    toolSources,
    toolSourceMigrations,
    a2aCalls,
    skillProposals,
    agents,
    environments,
    turns,
    threadRuntime,
    eventHub,
    shutdownSignal,
    sessions,
    automations,
    webhooks,
    eventTap: tap,
    config,
    redis,
    reads,
    docs,
    credentials,
    secretBox,
    audit,
    permissions,
    policies,
    approvals,
    surfaceScopes: new SurfaceScopeStore(redis, docs),
    installations: new AgentInstallationStore(redis, docs),
    idempotency: new IdempotencyStore(redis, secretBox, config.idempotencyTtlSeconds, config.masterKey),
    identity,
    runners,
    gatewayPresence: new PresenceStore(redis),
    models,
    metrics,
    log,
  };
}

/** The event hub's subscriber connection, for `/readyz` (live streams need it connected). */
const hubConnections = new WeakMap<EventHub, Redis>();

/** Paths served by an edge middleware rather than by the operation routes (a superset is fine). */
function isEdgePath(path: string): boolean {
  return path === MCP_PATH || path.startsWith('/v1/runtime/') || path.startsWith('/.well-known/') || path.startsWith('/a2a/')
    || path === CONSOLE_PREFIX || path.startsWith(`${CONSOLE_PREFIX}/`);
}

/** Runs middlewares in order, as Koa would, then `next`. */
function chain(list: readonly Koa.Middleware[]): Koa.Middleware {
  return (ctx, next) => {
    const at = (i: number): Promise<void> => {
      const mw = list[i];
      return mw ? Promise.resolve(mw(ctx, () => at(i + 1))) : next();
    };
    return at(0);
  };
}

export function createApi(config: ApiConfig, log: Logger = createLogger({ name: 'api', level: config.logLevel })): ApiServer {
  const redis = connectRedis(config.redisUrl, { name: 'api' });
  redis.on('error', (err) => log.warn({ err: err.message }, 'redis connection error'));
  const shutdown = new AbortController();
  const deps = buildDeps(config, log, redis, shutdown.signal);
  const operations = allOperations();
  const { router, prepared } = buildRouter(operations, deps);

  const app = new Koa({ proxy: false });
  app.silent = true;
  app.use(requestBoundary(deps));
  const hubConnection = hubConnections.get(deps.eventHub);
  const readiness = readinessCheck(redis, hubConnection ? { event_subscriber: () => hubConnection.status === 'ready' } : {});
  app.use((ctx, next) => {
    if (ctx.method !== 'GET') return next();
    if (ctx.path === '/healthz') {
      ctx.body = { status: shutdown.signal.aborted ? 'stopping' : 'ok' };
      ctx.status = shutdown.signal.aborted ? 503 : 200;
      return Promise.resolve();
    }
    // Readiness (a balancer's check): Redis answers and the live-event subscription is connected.
    if (ctx.path === '/readyz') {
      return readiness(shutdown.signal.aborted).then((r) => {
        ctx.status = r.status;
        ctx.body = r.body;
        ctx.set('cache-control', 'no-store');
      });
    }
    if (ctx.path === '/metrics' && config.metricsEnabled) {
      return deps.metrics.metrics().then((text) => {
        ctx.body = text;
        ctx.type = METRICS_CONTENT_TYPE;
      });
    }
    return next();
  });
  // The edges other than the operation routes (console, MCP, A2A, the runtime endpoints), each
  // entered only for its own paths: a /v1 operation request passes them with one prefix test.
  const edges: Koa.Middleware[] = [];
  if (config.consoleEnabled) edges.push(consoleStatic({ dir: config.consoleDir, log }));
  edges.push(mcpEdge(operations, prepared, deps).middleware);
  edges.push(a2aEdge(deps));
  const runtimeBearers = new RedisRuntimeBearers(redis, new LeaseFence(redis));
  edges.push(
    runtimeMcp(deps, { verifier: runtimeBearers }),
    runtimeFiles(deps, runtimeBearers),
    runtimeMemory(deps, runtimeBearers),
    runtimeToolSource(deps, runtimeBearers),
    runtimeGitCredentials(deps, runtimeBearers),
    runtimeProjects(deps, runtimeBearers),
    runtimeSkills(deps, runtimeBearers),
  );
  const edgeChain = chain(edges);
  app.use((ctx, next) => (isEdgePath(ctx.path) ? edgeChain(ctx, next) : next()));
  app.use(router.routes());
  // Every API process works off due approval expiries (BullMQ gives each job to one of them).
  deps.approvals.startExpiry();
  app.use(unmatchedRoute(router));

  const server = createServer({ keepAliveTimeout: 65_000, requestTimeout: 0, headersTimeout: 30_000 }, app.callback());
  server.on('clientError', (err: NodeJS.ErrnoException, socket: Duplex) => answerUnparsed(err, socket, config.docsUrl));
  // Node hands a CONNECT to its own event (unheard, the socket is dropped without an answer).
  server.on('connect', (_req: unknown, socket: Duplex) => refuseRaw(socket, config.docsUrl, 'CONNECT is not served: this API is not a proxy'));
  const gateway: Gateway | null = config.gatewayEmbedded
    ? attachGateway(server, {
        redis, log, metrics: deps.metrics,
        options: { heartbeatIntervalMs: config.runnerHeartbeatIntervalMs, presenceTtlMs: config.runnerPresenceTtlMs, maxFrameBytes: config.runnerMaxFrameBytes },
      })
    : null;
  if (gateway) {
    registerRunHandlers(gateway, {
      keeper: deps.runs.keeper, records: deps.runs.records, lifecycle: deps.runs.lifecycle, log: deps.sessions.store.log,
      store: deps.sessions.store, models: deps.models, lease: config.lease, logger: log, approvals: deps.approvals, metrics: deps.metrics,
      interruptGraceMs: config.interruptGraceMs,
    });
    registerSandboxRelease(gateway, deps.docs);
  }
  deps.automations.start();
  deps.skillProposals.start();
  deps.webhooks.start();
  deps.eventTap.start();
  deps.a2aCalls.start((err) => deps.log.warn({ err }, 'A2A tool call sweep failed'));
  deps.toolSourceMigrations.start();
  // What File commits and deletions, Project creations and deletions and MemoryStore deletions whose process died left behind (docs/FILES.md, docs/MEMORY.md).
  deps.files.startSweeping((err) => deps.log.warn({ err }, 'File commit sweep failed'));
  deps.projects.startSweeping((err) => deps.log.warn({ err }, 'Project creation sweep failed'));
  deps.memory.stores.startSweeping((err) => deps.log.warn({ err }, 'MemoryStore deletion sweep failed'));
  // Scratch repositories of skill-source reads a killed process left behind (docs/SKILLS.md).
  removeStaleScratch().then(
    (n) => n > 0 && log.info({ removed: n }, 'removed scratch directories of skill-source reads left by an earlier process'),
    (err: unknown) => log.warn({ err: err instanceof Error ? err.message : String(err) }, 'could not sweep skill-source scratch directories'),
  );

  return {
    server,
    deps,
    gateway,
    shutdownSignal: shutdown.signal,
    listen: () =>
      new Promise((resolve, reject) => {
        server.once('error', reject);
        server.listen({ port: config.port, host: config.host, backlog: LISTEN_BACKLOG }, () => {
          const addr = server.address();
          const port = typeof addr === 'object' && addr ? addr.port : config.port;
          if (gateway && config.gatewayLinkUrl !== null) gateway.advertiseLink(linkUrlFor(config.host, port, config.gatewayLinkUrl));
          resolve({ port });
        });
      }),
    async close() {
      shutdown.abort();
      await gateway?.close();
      await deps.runs.close();
      await deps.approvals.close();
      await deps.automations.close();
      await deps.skillProposals.close();
      deps.a2aCalls.close();
      await deps.toolSourceMigrations.close();
      deps.files.stopSweeping();
      deps.projects.stopSweeping();
      deps.memory.stores.stopSweeping();
      await deps.webhooks.close();
      await deps.eventTap.close();
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
      await deps.eventHub.close();
      await deps.reads.close();
      await deps.models.leases.close();
      await redis.quit().catch(() => redis.disconnect());
    },
  };
}

/**
 * A request Node's parser refused before the API saw it (an unknown method such as `FOO`, a
 * malformed request line or header, headers over the limit) still gets a Request-Id and, for a
 * 400, the API's error body, instead of a bare status line. The connection closes after it.
 */
function answerUnparsed(err: NodeJS.ErrnoException, socket: Duplex, docsUrl: string): void {
  if (err.code === 'ECONNRESET' || !socket.writable) {
    socket.destroy();
    return;
  }
  if (err.code === 'ERR_HTTP_REQUEST_TIMEOUT') {
    // The head never arrived whole: there is no request to answer with an error body.
    socket.end(`HTTP/1.1 408 Request Timeout\r\nRequest-Id: ${newRequestId()}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n`);
    return;
  }
  refuseRaw(socket, docsUrl, err.code === 'HPE_HEADER_OVERFLOW'
    ? 'the request line and headers are over the 16 KiB this API reads'
    : 'the request could not be parsed as HTTP/1.1 (unknown method, or a malformed request line or header)');
}

/** A 400 `validation.malformed` written on a socket the API's router never saw, which then closes. */
function refuseRaw(socket: Duplex, docsUrl: string, message: string): void {
  const body = JSON.stringify(new ApiError('validation.malformed', message).toWire(docsUrl));
  socket.end(`HTTP/1.1 400 Bad Request\r\nRequest-Id: ${newRequestId()}\r\nContent-Type: application/json; charset=utf-8\r\nContent-Length: ${Buffer.byteLength(body)}\r\nConnection: close\r\n\r\n${body}`);
}
