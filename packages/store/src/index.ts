export * from './redis.js';
export * from './keys.js';
export * from './cursor.js';
export * from './documents.js';
export * from './script.js';
export * from './embedded-redis.js';
export * from './event-log.js';
export * from './event-hub.js';
