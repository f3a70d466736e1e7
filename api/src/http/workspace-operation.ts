import type { Static, TSchema } from '@agentplane/core';
import { tags, type StoredDoc } from '@agentplane/store';
import type { ApiDeps } from '../deps.js';
import { defineOperation, json, type AuditDeclaration, type Operation, type OperationRequest } from './operation.js';
import { requireWorkspace, workspaceInBoundary } from './workspace-scope.js';

/**
 * Shorthands for the most common operation shape: a JSON operation acting in one Workspace
 * (the caller's own, or the `{workspace_id}` its path names) whose handler computes one body. Everything the pipeline enforces (auth,
 * permission, audit, idempotency, MCP exposure, versions) is still declared by the caller in
 * `decl`; only the method and the handler's wrapping are supplied here. The success status is
 * the declared `successStatus` (200 when none is declared).
 */
type Declaration<P extends TSchema, Q extends TSchema, B extends TSchema> = Omit<Operation<P, Q, B>, 'method' | 'handler'>;

/** Computes the response body of a Workspace-scoped operation; `ws` is the Workspace's id. */
export type WorkspaceHandler<P extends TSchema, Q extends TSchema, B extends TSchema> =
  (ws: string, req: OperationRequest<Static<P>, Static<Q>, Static<B>>) => Promise<unknown>;

type Resolve = (req: OperationRequest<unknown, unknown, unknown>) => Promise<string>;

function scopedOperation<P extends TSchema, Q extends TSchema, B extends TSchema>(
  method: Operation['method'], decl: Declaration<P, Q, B>, resolve: Resolve, body: WorkspaceHandler<P, Q, B>,
): Operation {
  const status = decl.successStatus ?? 200;
  return defineOperation<P, Q, B>({
    ...decl,
    method,
    async handler(req) {
      return json(status, await body(await resolve(req), req));
    },
  });
}

/** The caller's own Workspace (`Service-Workspace-Id`, or the one its key is bound to). */
const callerWorkspace: Resolve = async (req) => requireWorkspace(req.caller);

/** The `{workspace_id}` of the path, which must be inside the caller's boundary (404 otherwise, as `workspaceInBoundary`). */
const pathWorkspace: Resolve = async (req) => {
  const ws = (req.params as { workspace_id: string }).workspace_id;
  await workspaceInBoundary(req.caller, ws, req.deps);
  return ws;
};

/** A GET in the caller's Workspace answering what `body` returns. */
export function workspaceRead<P extends TSchema, Q extends TSchema, B extends TSchema>(
  decl: Declaration<P, Q, B>, body: WorkspaceHandler<P, Q, B>,
): Operation {
  return scopedOperation('GET', decl, callerWorkspace, body);
}

/** A mutation in the caller's Workspace answering what `body` returns; its audit record must be declared. */
export function workspaceWrite<P extends TSchema, Q extends TSchema, B extends TSchema>(
  method: Exclude<Operation['method'], 'GET'>, decl: Declaration<P, Q, B> & { audit: AuditDeclaration }, body: WorkspaceHandler<P, Q, B>,
): Operation {
  return scopedOperation(method, decl, callerWorkspace, body);
}

/** A GET on the Workspace its path names, answering what `body` returns. */
export function namedWorkspaceRead<P extends TSchema, Q extends TSchema, B extends TSchema>(
  decl: Declaration<P, Q, B> & { params: P }, body: WorkspaceHandler<P, Q, B>,
): Operation {
  return scopedOperation('GET', decl, pathWorkspace, body);
}

/** A mutation on the Workspace its path names, answering what `body` returns; its audit record must be declared. */
export function namedWorkspaceWrite<P extends TSchema, Q extends TSchema, B extends TSchema>(
  method: Exclude<Operation['method'], 'GET'>, decl: Declaration<P, Q, B> & { params: P; audit: AuditDeclaration }, body: WorkspaceHandler<P, Q, B>,
): Operation {
  return scopedOperation(method, decl, pathWorkspace, body);
}

/** One page of a Workspace's documents under `index`, oldest first (the `limit`/`page` query of `PageQuery`). */
export function listWorkspaceDocs<T extends StoredDoc>(deps: ApiDeps, ws: string, index: string, query: { limit?: number | undefined; page?: string | undefined }) {
  return deps.docs.list<T>(tags.workspace(ws), index, { ...pageOf(query), order: 'asc' });
}

/** The page a `PageQuery` asks for: its `page` cursor and its `limit` (20 when none is given). */
export function pageOf(query: { limit?: number | undefined; page?: string | undefined }): { limit: number; page: string | undefined } {
  return { limit: query.limit ?? 20, page: query.page };
}
