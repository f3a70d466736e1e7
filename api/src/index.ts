export { createApi, buildDeps, type ApiServer } from './app.js';
export { loadApiConfig, type ApiConfig } from './config.js';
export { bootstrapPlatform, type BootstrapResult } from './bootstrap.js';
export { allOperations } from './routes.js';
export { IdentityService } from './identity/service.js';
export { CredentialIndex } from './identity/credentials.js';
export type { ApiDeps } from './deps.js';
export type { Operation } from './http/operation.js';
export * from './models/index.js';
