export * from './agent.js';
export * from './capabilities.js';
export * from './config.js';
export * from './doctor.js';
export * from './executors/index.js';
