import type { Logger, SecretBox, Metrics } from '@agentplane/core';
import type { DocumentStore, Redis } from '@agentplane/store';
import type { ApiConfig } from './config.js';
import type { CredentialIndex } from './identity/credentials.js';
import type { IdempotencyStore } from './http/idempotency.js';
import type { IdentityService } from './identity/service.js';
import type { RunnerService } from './runners/service.js';
import type { PresenceStore } from '@agentplane/gateway';

/** Everything an operation handler may use. Built once per process in app.ts. */
export interface ApiDeps {
  config: ApiConfig;
  redis: Redis;
  docs: DocumentStore;
  credentials: CredentialIndex;
  idempotency: IdempotencyStore;
  identity: IdentityService;
  runners: RunnerService;
  /** Runner presence projection (read side; the gateway writes it). */
  gatewayPresence: PresenceStore;
  secretBox: SecretBox;
  metrics: Metrics;
  log: Logger;
}
