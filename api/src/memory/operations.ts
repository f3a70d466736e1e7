import { ApiError, Cursor, Id, Metadata, Nullable, Obj, Page, PageQuery, Type, Patch } from '@agentplane/core';
import { READERS, WRITERS, type Caller } from '../http/caller.js';
import { createOnce } from '../http/keyed-create.js';
import { defineOperation, json, type Operation } from '../http/operation.js';
import { pageOf, workspaceRead, workspaceWrite } from '../http/workspace-operation.js';
import { requireWorkspace } from '../http/workspace-scope.js';
import {
  checkPath, MEMORY_LIMITS, MemoryDocumentEntrySchema, MemoryDocumentSchema, MemoryPath, MemorySearchResultSchema, MemoryStoreSchema, MemoryVersionSchema,
  type MemoryAuthor,
} from './model.js';
import { cursorBinding, decodeBoundCursor, decodeListingCursor, encodeBoundCursor, encodeListingCursor } from './store.js';

const StorePath = Obj({ memory_store_id: Id('memoryStore') });
/** Reads admit Principal access credentials holding `read` on the store (or the Workspace). */
const readers = { kind: 'bearer', roles: READERS, principal: true } as const;
const writers = { kind: 'bearer', roles: WRITERS } as const;
const readPermission = { action: 'read', target: 'memory_store_id' } as const;
const managePermission = { action: 'manage', target: 'memory_store_id' } as const;

/** The API caller a document version is attributed to. */
export function authorOf(caller: Caller): MemoryAuthor {
  return { kind: caller.kind === 'principal_credential' ? 'principal_credential' : 'api_key', id: caller.credentialId, principal_id: caller.principalId };
}

/**
 * The version a history cursor continues below, from a cursor bound to the store and path it was
 * issued for: 400 for another store's or path's cursor or a version that is not a safe integer of
 * at least 1.
 */
export function decodeVersionCursor(cursor: string, storeId: string, path: string, field: string): number {
  const value = decodeBoundCursor('version', cursor, field, cursorBinding(storeId, path), 'path\'s history');
  const version = /^[1-9][0-9]*$/.test(value) ? Number(value) : NaN;
  if (!Number.isSafeInteger(version)) throw new ApiError('validation.malformed', `${field}: not a cursor of this path's history`);
  return version;
}

/**
 * MemoryStores: durable, searchable agent memory (docs/MEMORY.md). A store's documents are
 * addressed by path (`path` in the query or body, since paths hold `/`), carry a per-path
 * compare-and-swap `version` and keep every version.
 */
export const memoryOperations: Operation[] = [
  workspaceWrite('POST', {
    operationId: 'memoryStores.createMemoryStore', path: '/v1/memory-stores', summary: 'Create a MemoryStore',
    audit: { target: 'response' }, auth: writers, idempotency: 'optional', mcp: 'full', successStatus: 201,
    permission: { action: 'manage', target: 'workspace' },
    body: Obj({ name: Type.String({ minLength: 1, maxLength: 200 }), description: Type.Optional(Nullable(Type.String({ maxLength: 2000 }))), metadata: Type.Optional(Metadata()) }),
    response: MemoryStoreSchema,
  }, async (ws, { body, deps, keyed }) => {
    // Made once per keyed request (`memory-store-created` names the point after its head is
    // written); a store whose creation died before confirming its marker gets one from its next
    // write. Answered as its first attempt would have answered it.
    const stores = deps.memory.stores;
    const store = await createOnce('memoryStore', keyed, (id) => stores.findStore(ws, id), (id) => stores.createStore(ws, body, id));
    return { ...store, document_count: 0 };
  }),
  workspaceRead({
    operationId: 'memoryStores.listMemoryStores', path: '/v1/memory-stores', summary: 'List the MemoryStores of the Workspace, oldest first',
    auth: { kind: 'bearer', roles: READERS }, query: PageQuery({}), response: Page(MemoryStoreSchema), mcp: 'compact',
  }, async (ws, { query, deps }) => {
    const page = await deps.memory.stores.listStores(ws, pageOf(query));
    return { data: await Promise.all(page.data.map((s) => deps.memory.view(s))), next_page: page.next_page };
  }),
  workspaceRead({
    operationId: 'memoryStores.getMemoryStore', path: '/v1/memory-stores/{memory_store_id}', summary: 'Read a MemoryStore',
    auth: readers, permission: readPermission, mcpPrincipal: true, params: StorePath, response: MemoryStoreSchema, mcp: 'compact',
  }, async (ws, { params, deps }) => deps.memory.view(await deps.memory.getStore(ws, params.memory_store_id))),
  defineOperation({
    operationId: 'memoryStores.updateMemoryStore', method: 'POST', path: '/v1/memory-stores/{memory_store_id}', summary: 'Update a MemoryStore\'s name, description or metadata',
    audit: { target: 'memory_store_id' }, auth: writers, permission: managePermission, params: StorePath, mcp: 'full',
    body: Patch({
      expected_version: Type.Optional(Type.Integer({ minimum: 1 })), name: Type.Optional(Type.String({ minLength: 1, maxLength: 200 })),
      description: Type.Optional(Nullable(Type.String({ maxLength: 2000 }))), metadata: Type.Optional(Metadata()),
    }),
    response: MemoryStoreSchema,
    async handler({ caller, params, body, deps }) {
      const { expected_version, ...patch } = body;
      const s = await deps.memory.stores.updateStore(requireWorkspace(caller), params.memory_store_id, patch, expected_version);
      return json(200, await deps.memory.view(s));
    },
  }),
  workspaceWrite('DELETE', {
    operationId: 'memoryStores.deleteMemoryStore', path: '/v1/memory-stores/{memory_store_id}', summary: 'Delete a MemoryStore and every document and version in it',
    audit: { target: 'memory_store_id' }, auth: writers, permission: managePermission, params: StorePath, mcp: 'full',
    response: Obj({ id: Id('memoryStore'), type: Type.Literal('memory_store_deleted') }),
  }, async (ws, { params, deps }) => {
    await deps.memory.stores.removeStore(ws, params.memory_store_id);
    deps.memory.index.forget(params.memory_store_id);
    return { id: params.memory_store_id, type: 'memory_store_deleted' };
  }),
  workspaceRead({
    operationId: 'memoryStores.listDocuments', path: '/v1/memory-stores/{memory_store_id}/documents',
    summary: 'List the documents of a MemoryStore by path (no content), optionally under a prefix',
    auth: readers, permission: readPermission, params: StorePath, mcp: 'compact',
    query: PageQuery({ path_prefix: Type.Optional(Type.String({ minLength: 1, maxLength: MEMORY_LIMITS.maxPathChars })) }, 1000, 100),
    response: Page(MemoryDocumentEntrySchema),
  }, async (ws, { params, query, deps }) => {
    await deps.memory.getStore(ws, params.memory_store_id);
    // The cursor is bound to the store and prefix it was issued under (another's cursor is 400). It
    // names the page's last path, or, for a path too long to fit a cursor, that path's digest,
    // resolved through the path's history (a digest no path of this store has is 400).
    const what = 'listing (path_prefix)';
    const binding = cursorBinding(params.memory_store_id, query.path_prefix ?? '');
    const at = query.page !== undefined ? decodeListingCursor(query.page, 'query.page', binding, what) : undefined;
    const after = at === undefined || 'path' in at ? at?.path : await deps.memory.stores.pathOf(params.memory_store_id, at.digest);
    if (after === null) throw new ApiError('validation.malformed', `query.page: not a cursor of this ${what}`);
    const r = await deps.memory.stores.list(params.memory_store_id, { prefix: query.path_prefix, limit: query.limit ?? 100, after });
    return { data: r.data, next_page: r.next !== null ? encodeListingCursor(binding, r.next) : null };
  }),
  workspaceRead({
    operationId: 'memoryStores.getDocument', path: '/v1/memory-stores/{memory_store_id}/document',
    summary: 'Read a document by path: the current version, or `version` from its history',
    auth: readers, permission: readPermission, mcpPrincipal: true, params: StorePath, mcp: 'compact',
    query: Obj({ path: MemoryPath(), version: Type.Optional(Type.Integer({ minimum: 1 })) }),
    response: MemoryVersionSchema,
  }, async (ws, { params, query, deps }) => {
    await deps.memory.getStore(ws, params.memory_store_id);
    const doc = query.version !== undefined
      ? await deps.memory.stores.readVersion(params.memory_store_id, query.path, query.version)
      : await deps.memory.stores.read(params.memory_store_id, query.path);
    if (!doc) throw new ApiError('validation.not_found', `no document at ${query.path}${query.version !== undefined ? ` with version ${query.version}` : ''}`);
    return doc;
  }),
  defineOperation({
    operationId: 'memoryStores.writeDocument', method: 'PUT', path: '/v1/memory-stores/{memory_store_id}/document',
    summary: 'Create or replace a document (compare-and-swap with `expected_version`; 0 creates only)',
    audit: { target: 'memory_store_id' }, auth: writers, permission: managePermission, params: StorePath, idempotency: 'optional', mcp: 'full',
    body: Obj({
      path: MemoryPath(), content: Type.String({ description: `UTF-8 text, at most ${MEMORY_LIMITS.maxContentBytes} bytes` }), metadata: Type.Optional(Metadata()),
      expected_version: Type.Optional(Type.Integer({ minimum: 0 })),
    }),
    response: MemoryDocumentSchema,
    async handler({ caller, params, body, deps }) {
      const ws = requireWorkspace(caller);
      await deps.memory.getStore(ws, params.memory_store_id);
      const r = await deps.memory.stores.write(params.memory_store_id, { path: body.path, content: body.content, metadata: body.metadata, expectedVersion: body.expected_version }, authorOf(caller), ws);
      return json(r.created ? 201 : 200, r.document);
    },
  }),
  defineOperation({
    operationId: 'memoryStores.deleteDocument', method: 'DELETE', path: '/v1/memory-stores/{memory_store_id}/document',
    summary: 'Delete a document (its history stays readable)',
    audit: { target: 'memory_store_id' }, auth: writers, permission: managePermission, params: StorePath, mcp: 'full',
    query: Obj({ path: MemoryPath(), expected_version: Type.Optional(Type.Integer({ minimum: 1 })) }),
    response: MemoryVersionSchema,
    async handler({ caller, params, query, deps }) {
      const ws = requireWorkspace(caller);
      await deps.memory.getStore(ws, params.memory_store_id);
      checkPath(query.path, 'query.path');
      return json(200, await deps.memory.stores.remove(params.memory_store_id, query.path, query.expected_version, authorOf(caller), ws));
    },
  }),
  workspaceRead({
    operationId: 'memoryStores.listDocumentVersions', path: '/v1/memory-stores/{memory_store_id}/document/versions',
    summary: 'The version history of a path, newest first (deletions included)',
    auth: readers, permission: readPermission, params: StorePath, mcp: 'full',
    query: PageQuery({ path: MemoryPath() }),
    response: Page(MemoryVersionSchema),
  }, async (ws, { params, query, deps }) => {
    await deps.memory.getStore(ws, params.memory_store_id);
    const before = query.page !== undefined ? decodeVersionCursor(query.page, params.memory_store_id, query.path, 'query.page') : undefined;
    const r = await deps.memory.stores.history(params.memory_store_id, query.path, query.limit ?? 20, before);
    if (r.data.length === 0 && before === undefined) throw new ApiError('validation.not_found', `no document was ever written at ${query.path}`);
    return { data: r.data, next_page: r.next_version !== null ? encodeBoundCursor('version', cursorBinding(params.memory_store_id, query.path), String(r.next_version)) : null };
  }),
  workspaceRead({
    operationId: 'memoryStores.searchMemory', path: '/v1/memory-stores/{memory_store_id}/search',
    summary: 'Full-text search over the documents of a MemoryStore (`results` plus `next_cursor`)',
    auth: readers, permission: readPermission, mcpPrincipal: true, params: StorePath, mcp: 'compact',
    query: Obj({
      query: Type.String({ minLength: 1, maxLength: MEMORY_LIMITS.maxQueryChars }),
      limit: Type.Optional(Type.Integer({ minimum: 1, maximum: 100, default: 10 })),
      cursor: Type.Optional(Cursor()),
      path_prefix: Type.Optional(Type.String({ minLength: 1, maxLength: MEMORY_LIMITS.maxPathChars })),
    }),
    response: Obj({ results: Type.Array(MemorySearchResultSchema), next_cursor: Nullable(Cursor()) }),
  }, async (ws, { params, query, deps }) => {
    await deps.memory.getStore(ws, params.memory_store_id);
    return deps.memory.search(params.memory_store_id, { query: query.query, limit: query.limit ?? 10, cursor: query.cursor, path_prefix: query.path_prefix }, 'query');
  }),
];
