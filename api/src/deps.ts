import type { Logger, SecretBox, Metrics } from '@agentplane/core';
import type { DocumentStore, Redis } from '@agentplane/store';
import type { ApiConfig } from './config.js';
import type { CredentialIndex } from './identity/credentials.js';
import type { IdempotencyStore } from './http/idempotency.js';
import type { IdentityService } from './identity/service.js';
import type { ModelsModule } from './models/module.js';

/** Everything an operation handler may use. Built once per process in app.ts. */
export interface ApiDeps {
  config: ApiConfig;
  redis: Redis;
  docs: DocumentStore;
  credentials: CredentialIndex;
  idempotency: IdempotencyStore;
  identity: IdentityService;
  /** Model credentials, routing profiles, the model gateway service, usage and budgets. */
  models: ModelsModule;
  secretBox: SecretBox;
  metrics: Metrics;
  log: Logger;
}
