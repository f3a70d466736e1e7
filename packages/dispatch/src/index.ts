export * from './directory.js';
export { PoolDispatcher, type DispatchHooks, type DispatcherOptions } from './dispatcher.js';
export { runHooks } from './hooks.js';
export { DispatchMetrics } from './metrics.js';
export { RedisOfferChannel } from './offer-channel.js';
export { PresenceDirectory } from './presence-directory.js';
export { LeaseSpecBuilder, type LeaseSpecSources } from './lease-spec.js';
