import { envEnum, envInt, envString, type Env } from '@agentplane/core';
import { checkedRedisUrl } from '@agentplane/store';
import { RUNNER_DEFAULTS } from '@agentplane/protocol';
import { gatewayLinkUrlFrom } from './link.js';

/** The standalone gateway's settings (`gateway/dist/main.js`), all read before anything starts. */
export function loadGatewayConfig(env: Env) {
  return {
    graceMs: envInt(env, 'SHUTDOWN_GRACE_MS', 10_000, 0),
    linkUrl: gatewayLinkUrlFrom(env),
    logLevel: envEnum(env, 'LOG_LEVEL', ['fatal', 'error', 'warn', 'info', 'debug', 'trace', 'silent'] as const, 'info'),
    redisUrl: checkedRedisUrl(envString(env, 'REDIS_URL')),
    docsUrl: envString(env, 'DOCS_URL', 'https://docs.agentplane.dev'),
    runners: {
      // The same ranges as the api's (api/src/config.ts).
      heartbeatIntervalMs: envInt(env, 'RUNNER_HEARTBEAT_INTERVAL_MS', RUNNER_DEFAULTS.heartbeatIntervalMs, 100, 600_000),
      presenceTtlMs: envInt(env, 'RUNNER_PRESENCE_TTL_MS', RUNNER_DEFAULTS.presenceTtlMs, 300, 3_600_000),
      maxFrameBytes: envInt(env, 'RUNNER_MAX_FRAME_BYTES', RUNNER_DEFAULTS.maxFrameBytes, 1024, 64 * 1024 * 1024),
    },
    port: envInt(env, 'PORT', 8081, 0, 65535),
    host: envString(env, 'HOST', '127.0.0.1'),
  };
}
