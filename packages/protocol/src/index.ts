export * from './model.js';
export * from './runner.js';
export * from './runner-exit.js';
export * from './runner-files.js';
