import { ApiError, Id, Obj, Page, PageQuery, Type } from '@agentplane/core';
import { runSessionsKey } from '@agentplane/domain';
import { tags } from '@agentplane/store';
import { READERS } from '../http/caller.js';
import type { Operation } from '../http/operation.js';
import { workspaceRead } from '../http/workspace-operation.js';
import { publicDoc, type RunDoc } from '@agentplane/domain';


const RunSchema = Type.Object(
  {
    id: Id('run'), type: Type.Literal('run'), session_id: Id('session'), workspace_id: Id('workspace'), session_thread_id: Id('thread'),
    status: Type.String(), runner_pool_id: Type.Optional(Type.Union([Type.String(), Type.Null()])),
    attempts: Type.Optional(Type.Array(Type.Record(Type.String(), Type.Unknown()))),
    timestamps: Type.Optional(Type.Record(Type.String(), Type.Union([Type.String(), Type.Null()]))),
    waiting_reason: Type.Optional(Type.Union([Type.String(), Type.Null()])), stop_reason: Type.Optional(Type.Unknown()),
  },
  { additionalProperties: true },
);

const view = (r: RunDoc): Record<string, unknown> => {
  const v = publicDoc(r);
  v.attempts ??= [];
  v.waiting_reason ??= null;
  v.stop_reason ??= null;
  v.failure ??= null;
  return v;
};

async function sessionInWorkspace(deps: Parameters<Operation['handler']>[0]['deps'], ws: string, sessionId: string): Promise<void> {
  await deps.sessions.store.get(ws, sessionId);
}

export const runOperations: Operation[] = [
  workspaceRead({
    operationId: 'runs.getRun', path: '/v1/runs/{run_id}', summary: 'Read a Run: status, attempts (runner, cause), dispatch timestamps',
    auth: { kind: 'bearer', roles: READERS }, params: Obj({ run_id: Id('run') }), response: RunSchema, mcp: 'compact',
  }, async (ws, { params, deps }) => {
    const sessionId = await deps.redis.hget(runSessionsKey(ws), params.run_id);
    const run = sessionId ? await deps.sessions.store.run(sessionId, params.run_id) : null;
    if (!run || run.workspace_id !== ws) throw new ApiError('validation.not_found', 'run not found');
    return view(run);
  }),
  workspaceRead({
    operationId: 'runs.listSessionRuns', path: '/v1/sessions/{session_id}/runs', summary: 'The Runs of a Session, newest first',
    auth: { kind: 'bearer', roles: READERS }, params: Obj({ session_id: Id('session') }), query: PageQuery({}), response: Page(RunSchema), mcp: 'compact',
  }, async (ws, { params, query, deps }) => {
    await sessionInWorkspace(deps, ws, params.session_id);
    const page = await deps.docs.list<RunDoc>(tags.session(params.session_id), 'runs', { limit: query.limit ?? 20, page: query.page, order: 'desc' });
    return { data: page.data.map(view), next_page: page.next_page };
  }),
];
