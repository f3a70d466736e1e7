export { createModelsModule, loadPrices, type ModelsModule, type ModelsConfig, type ModelsModuleDeps } from './module.js';
export { ModelGatewayService, toModelError, type ModelStepContext, type StepPlan } from './gateway-service.js';
export { BudgetGuard, secondsToReset, type BudgetSubject, type SessionBudget, type WorkspaceBudget } from './budget.js';
export { UsageAccumulator, type UsageAttribution, type UsageScope, type UsageSummary } from './usage.js';
export { ModelCredentialService, type CreateModelCredentialInput } from './credentials.js';
export { RoutingProfileService, DEFAULT_MODEL_KEY } from './profiles.js';
export { ModelStreams, type ModelFrame, type ModelStreamsOptions } from './model-streams.js';
export type * from './model.js';
export { LEASE_RECHECK_MS, LeaseStreams, type LeaseStreamsOptions, type StepLease } from './lease-streams.js';
