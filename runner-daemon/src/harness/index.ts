export * from './events.js';
export { HarnessLoop, type HarnessDeps, type RunInput, type RunOutcome, type PendingResponses } from './loop.js';
export * from './tools/index.js';
