export * from './http.js';
export * from './sse.js';
