import { readFileSync } from 'node:fs';
import type { Logger, Metrics, SecretBox } from '@agentplane/core';
import type { DocumentStore, Redis } from '@agentplane/store';
import { defaultAdapters, mergePriceTables, parsePriceTable, SHIPPED_PRICES, type PriceTable, type ProviderAdapter, type ProviderKey } from '@agentplane/models';
import { BudgetGuard } from './budget.js';
import { ModelCredentialService } from './credentials.js';
import { ModelGatewayService } from './gateway-service.js';
import { LeaseStreams } from './lease-streams.js';
import { RoutingProfileService } from './profiles.js';
import { UsageAccumulator } from './usage.js';

export interface ModelsConfig {
  /** JSON price table laid over the shipped one (MODEL_PRICES_FILE). */
  pricesFile?: string | undefined;
  /** Per provider request: time to response headers and between stream chunks (MODEL_PROVIDER_TIMEOUT_MS). */
  providerTimeoutMs: number;
  /** The overall deadline of one model step (MODEL_STEP_DEADLINE_MS; absent: 600000). */
  stepDeadlineMs?: number | undefined;
}

export interface ModelsModuleDeps {
  redis: Redis;
  docs: DocumentStore;
  secretBox: SecretBox;
  log: Logger;
  config: ModelsConfig;
  /** Model step counters and time-to-first-token histograms (optional). */
  metrics?: Metrics;
  /** Replace adapters (tests of our own code only; production uses the defaults). */
  adapters?: Record<ProviderKey, ProviderAdapter>;
}

/** Everything model access needs, built once per process. */
export interface ModelsModule {
  credentials: ModelCredentialService;
  profiles: RoutingProfileService;
  usage: UsageAccumulator;
  budgets: BudgetGuard;
  gateway: ModelGatewayService;
  prices: PriceTable;
  /**
   * The model steps this process serves under runner leases, ended wherever their lease ends
   * (docs/MODELS.md). Its subscriber is made by the first such step and closes with the Redis
   * connection the module was given (or with `leases.close()`).
   */
  leases: LeaseStreams;
}

export function loadPrices(file: string | undefined): PriceTable {
  if (!file) return SHIPPED_PRICES;
  return mergePriceTables(SHIPPED_PRICES, parsePriceTable(JSON.parse(readFileSync(file, 'utf8')) as unknown));
}

export function createModelsModule(deps: ModelsModuleDeps): ModelsModule {
  const adapters = deps.adapters ?? defaultAdapters();
  const prices = loadPrices(deps.config.pricesFile);
  const log = deps.log.child({ module: 'models' });
  const credentials = new ModelCredentialService(deps.docs, deps.redis, deps.secretBox, adapters, log);
  const profiles = new RoutingProfileService(deps.docs, deps.redis, credentials);
  const usage = new UsageAccumulator(deps.redis);
  const budgets = new BudgetGuard(deps.redis, usage);
  const leases = new LeaseStreams(deps.redis, log);
  const gateway = new ModelGatewayService(credentials, profiles, usage, budgets, adapters, {
    prices, providerTimeoutMs: deps.config.providerTimeoutMs, stepDeadlineMs: deps.config.stepDeadlineMs ?? 600_000, leases,
  }, log, deps.docs, deps.metrics);
  return { credentials, profiles, usage, budgets, gateway, prices, leases };
}
