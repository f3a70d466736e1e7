export * from './model.js';
export * from './runner.js';
