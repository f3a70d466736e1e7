export * from './gateway.js';
export * from './presence.js';
export * from './auth.js';
export * from './link.js';
