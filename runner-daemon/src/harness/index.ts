export * from './events.js';
export { HarnessLoop, type HarnessDeps, type RunInput, type RunOutcome, type PendingResponses } from './loop.js';
export * from './tools/index.js';
export { createHarnessExecutor, parseHarnessSpec, LeaseEventSink, HarnessSpecError, type HarnessLease, type HarnessRunSpec, type HarnessExecutorDeps, type HarnessRunResult } from './executor.js';
