import type { Operation } from './http/operation.js';
import { connectionOperations } from './connections/operations.js';
import { identityOperations } from './identity/operations.js';
import { metaOperations } from './meta/operations.js';

/**
 * The operation table: every REST operation of the API, once. The router, the OpenAPI
 * document, the capability report and the MCP tool projection are all generated from it.
 * Each domain module contributes its own list here.
 */
export function allOperations(): Operation[] {
  const table: Operation[] = [];
  table.push(...metaOperations(() => table), ...identityOperations);
  table.push(...connectionOperations);
  return table;
}
