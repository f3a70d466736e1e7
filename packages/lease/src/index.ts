export * from './config.js';
export * from './requirements.js';
export * from './fence.js';
export * from './queues.js';
export * from './keeper.js';
export * from './offers.js';
export * from './delayed.js';
export * from './cancels.js';
