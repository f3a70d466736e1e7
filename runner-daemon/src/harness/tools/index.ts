export * from './types.js';
export * from './builtin.js';
