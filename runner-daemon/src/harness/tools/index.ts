export * from './types.js';
export * from './builtin.js';
export * from './question.js';
