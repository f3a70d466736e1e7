// The documents and services more than one process uses. The api serves them over HTTP; the
// scheduler drives the Run life cycle with them; neither reaches into the other.
export * from './versioned.js';
export * from './identity/roles.js';
export * from './identity/model.js';
export * from './identity/credentials.js';
export * from './identity/service.js';
export * from './runners/model.js';
export * from './runners/service.js';
export * from './agents/tools.js';
export * from './agents/model.js';
export * from './environments/model.js';
export * from './deployments/profiles.js';
export * from './files/model.js';
export * from './files/store.js';
export * from './connections/model.js';
export * from './connections/runtime-bearer.js';
export * from './connections/service.js';
export * from './sessions/model.js';
export * from './sessions/store.js';
export * from './sessions/turns.js';
export * from './runs/keys.js';
export * from './runs/history.js';
export * from './runs/spec.js';
export * from './runs/outbox.js';
export * from './runs/lifecycle.js';
export * from './runs/engine.js';
export * from './identity/bootstrap.js';
