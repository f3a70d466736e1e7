import { ApiError, crashPoint, Cursor, Id, Nullable, Obj, Type } from '@agentplane/core';
import type { LogEvent } from '@agentplane/store';
import { READERS, WRITERS } from '../http/caller.js';
import { defineOperation, json, type Operation } from '../http/operation.js';
import { workspaceRead, workspaceWrite } from '../http/workspace-operation.js';
import { requireWorkspace } from '../http/workspace-scope.js';
import { checkCoordinatorTools, normaliseMcp, normaliseTools } from '@agentplane/domain';
import type { ApiDeps } from '../deps.js';
import type { SessionDoc } from '@agentplane/domain';
import {
  checkDrivePayload, CreateSessionBody, DriveEventBody, ListSessionsQuery, ResourceInput, ResourcePath, ResourceUpdate,
  SessionPath, StreamQuery, UpdateSessionBody,
} from './schemas.js';
import { checkedCursor, sseStream } from './stream.js';
import { checkMountPath, keyedSession, refuseSecondMemoryStore } from './service.js';
import { a2aTaskListings } from '../a2a/task-index.js';
import { refusePlatformMetadata, replacedMetadata } from './metadata.js';

const readers = { kind: 'bearer', roles: READERS } as const;
const writers = { kind: 'bearer', roles: WRITERS } as const;

const SessionSchema = Type.Unsafe<Record<string, unknown>>({ type: 'object', description: 'Session (docs/API.md)' });
const EventSchema = Obj({
  id: Id('event'), seq: Type.Integer({ minimum: 1 }), created_at: Type.String(), session_id: Id('session'),
  session_thread_id: Nullable(Id('thread')), type: Type.String(), payload: Type.Unsafe<unknown>({}),
});
const ResourceSchema = Type.Unsafe<Record<string, unknown>>({ type: 'object', description: 'Session Resource (docs/API.md)' });

export function deltaFilter(param: string | undefined): ((d: { type: string }) => boolean) | null {
  if (!param) return null;
  const kinds = new Set(param.split(','));
  return (d) => kinds.has(d.type);
}

async function liveSession(deps: ApiDeps, ws: string, id: string): Promise<SessionDoc> {
  return deps.sessions.store.get(ws, id);
}

/**
 * A Session's answer, kept by an Idempotency-Key as its id only and replayed as the Session is now
 * (once erased, its 404, never the erased content): every operation that creates a Session.
 */
export const sessionReplay: NonNullable<Operation['erasureSafe']> = {
  keep: (body) => ({ id: (body as { id: string }).id }),
  rehydrate: async (kept, { caller, deps }) => deps.sessions.view(await liveSession(deps, requireWorkspace(caller), (kept as { id: string }).id)),
};

/**
 * A Session Resource's answer, kept as its id only and replayed as the Resource is now (once the
 * Session is erased, or the Resource removed, its 404, never the erased content).
 */
const resourceReplay: NonNullable<Operation['erasureSafe']> = {
  keep: (body) => ({ id: (body as { id: string }).id }),
  rehydrate: async (kept, { caller, params, deps }) => {
    const s = await liveSession(deps, requireWorkspace(caller), (params as { session_id: string }).session_id);
    const r = s.resources.find((x) => x.id === (kept as { id: string }).id);
    if (!r) throw new ApiError('validation.not_found', 'resource not found');
    return r;
  },
};

/** A drive event's answer, kept as its place in the log and replayed from the log (404 once erased). */
const eventReplay: NonNullable<Operation['erasureSafe']> = {
  keep: (body) => {
    const e = body as LogEvent;
    return { id: e.id, seq: e.seq, session_id: e.session_id };
  },
  rehydrate: async (kept, { caller, deps }) => {
    const k = kept as { id: string; seq: number; session_id: string };
    await liveSession(deps, requireWorkspace(caller), k.session_id);
    const [event] = await deps.sessions.store.log.range(k.session_id, k.seq - 1, 1, k.seq);
    if (!event || event.id !== k.id) throw new ApiError('validation.not_found', `event ${k.id} is no longer in the session's log (retention)`);
    return event;
  },
};

/** The request fingerprints of keyed Resource adds, of the Resources still there (and `added`'s). */
function keptFingerprints(kept: Record<string, string> | undefined, resources: readonly { id: string }[], added?: string, fingerprint?: string): Record<string, string> {
  const out: Record<string, string> = {};
  for (const r of resources) {
    const fp = r.id === added ? fingerprint : kept?.[r.id];
    if (fp !== undefined) out[r.id] = fp;
  }
  return out;
}

export const sessionOperations: Operation[] = [
  workspaceWrite('POST', {
    operationId: 'sessions.createSession', path: '/v1/sessions', summary: 'Create a Session',
    audit: { target: 'response' },
    auth: { ...writers, principal: true }, permission: { action: 'invoke', target: 'body.agent', authorIsCaller: true, attachments: true }, actionPolicy: 'initial_events',
    body: CreateSessionBody, response: SessionSchema, successStatus: 201, idempotency: 'optional', mcp: 'compact',
    erasureSafe: sessionReplay,
  }, (ws, { body, idempotencyKey, keyed, deps, trace }) => {
    refusePlatformMetadata(body.metadata);
    return deps.sessions.create(ws, body, idempotencyKey, { trace, ...keyedSession(keyed) });
  }),
  defineOperation({
    operationId: 'sessions.listSessions', method: 'GET', path: '/v1/sessions',
    summary: 'List Sessions, newest first; archived ones only when asked', auth: readers, query: ListSessionsQuery,
    response: Obj({ data: Type.Array(SessionSchema), next_page: Nullable(Cursor()), prev_page: Nullable(Cursor()) }), mcp: 'compact',
    async handler({ caller, query, deps }) {
      if (query.created_after && query.created_before && Date.parse(query.created_after) > Date.parse(query.created_before)) {
        throw new ApiError('validation.malformed', 'query.created_after is later than query.created_before');
      }
      return json(200, await deps.sessions.list(requireWorkspace(caller), query));
    },
  }),
  workspaceRead({
    operationId: 'sessions.getSession', path: '/v1/sessions/{session_id}', summary: 'Read a Session',
    auth: { ...readers, principal: true }, permission: { action: 'observe', target: 'session_id' },
    params: SessionPath, response: SessionSchema, mcp: 'compact',
  }, async (ws, { params, deps }) => deps.sessions.view(await liveSession(deps, ws, params.session_id))),
  defineOperation({
    operationId: 'sessions.updateSession', method: 'POST', path: '/v1/sessions/{session_id}',
    audit: { target: 'session_id' },
    summary: 'Update a Session; supplied collections fully replace; agent changes govern later Runs only', auth: writers,
    params: SessionPath, body: UpdateSessionBody, response: SessionSchema, idempotency: 'optional', mcp: 'compact',
    erasureSafe: sessionReplay,
    async handler({ caller, params, body, deps }) {
      const ws = requireWorkspace(caller);
      refusePlatformMetadata(body.metadata);
      if (body.vault_ids !== undefined) await deps.vaults.requireAll(ws, body.vault_ids);
      const s = await deps.sessions.store.update(ws, params.session_id, (cur) => {
        if (cur.archived_at !== null) throw new ApiError('runtime.invalid_transition', 'an archived session cannot be changed');
        if (cur.agent.multiagent && body.agent?.tools) checkCoordinatorTools(body.agent.tools, 'body.agent.tools');
        return {
          ...cur,
          ...(body.agent ? {
            agent: {
              ...cur.agent,
              ...(body.agent.tools !== undefined ? { tools: normaliseTools(body.agent.tools) } : {}),
              ...(body.agent.mcp_servers !== undefined ? { mcp_servers: normaliseMcp(body.agent.mcp_servers) } : {}),
            },
          } : {}),
          ...(body.budget !== undefined ? { budget: body.budget ? { max_list_cost: { amount: body.budget.max_list_cost.amount, currency: 'USD' as const } } : null } : {}),
          ...(body.metadata !== undefined ? { metadata: replacedMetadata(body.metadata, cur.metadata) } : {}),
          ...(body.title !== undefined ? { title: body.title } : {}),
          ...(body.vault_ids !== undefined ? { vault_ids: body.vault_ids } : {}),
        };
      });
      return json(200, await deps.sessions.view(s));
    },
  }),
  workspaceWrite('POST', {
    operationId: 'sessions.archiveSession', path: '/v1/sessions/{session_id}/archive',
    audit: { target: 'session_id' },
    summary: 'Archive a Session (one-way, retry-safe): no new work, reads stay', auth: writers, params: SessionPath,
    response: SessionSchema, idempotency: 'optional', mcp: 'compact', erasureSafe: sessionReplay,
  }, async (ws, { params, deps }) => deps.sessions.view(await deps.sessions.archive(ws, params.session_id))),
  workspaceWrite('DELETE', {
    operationId: 'sessions.deleteSession', path: '/v1/sessions/{session_id}',
    audit: { target: 'session_id' },
    summary: 'Delete a Session and erase its event log (retry-safe)', auth: writers, params: SessionPath,
    response: Obj({ id: Id('session'), type: Type.Literal('session_deleted') }), mcp: 'full',
  }, async (ws, { params, deps }) => {
    // An A2A task's Session leaves its caller's task index with its own listings (docs/A2A.md).
    await deps.sessions.store.erase(ws, params.session_id, { listings: a2aTaskListings });
    // Its ActionApprovals hold tool inputs: they go with the Session.
    await deps.approvals.eraseSession(ws, params.session_id);
    return { id: params.session_id, type: 'session_deleted' };
  }),

  // ---- resources ----
  workspaceRead({
    operationId: 'sessions.listResources', path: '/v1/sessions/{session_id}/resources', summary: 'List the Resources of a Session',
    auth: readers, params: SessionPath, response: Obj({ data: Type.Array(ResourceSchema), next_page: Nullable(Cursor()) }), mcp: 'full',
  }, async (ws, { params, deps }) => {
    const s = await liveSession(deps, ws, params.session_id);
    return { data: s.resources, next_page: null };
  }),
  defineOperation({
    operationId: 'sessions.addResource', method: 'POST', path: '/v1/sessions/{session_id}/resources', summary: 'Add a Resource to a Session',
    audit: { target: 'response' },
    auth: writers, params: SessionPath, body: ResourceInput, response: ResourceSchema, successStatus: 201, idempotency: 'optional', mcp: 'full',
    erasureSafe: resourceReplay,
    async handler({ caller, params, body, keyed, deps }) {
      await deps.sessions.checkResources(requireWorkspace(caller), [body as { type: string; file_id?: string }]);
      // Keyed: its id derived from the key, so the retry of an add whose first attempt died after
      // writing it (its key's pending record gone with it) finds it and answers it (201, as the
      // first would have), and another request under the key is 409.
      let r = deps.sessions.newResource(body as Record<string, unknown>, keyed?.id('resource'));
      let out = r;
      await deps.sessions.store.update(requireWorkspace(caller), params.session_id, (cur) => {
        const earlier = keyed ? cur.resources.find((x) => x.id === r.id) : undefined;
        if (keyed && earlier) {
          if (Date.parse(earlier.created_at) + keyed.keptMs > Date.now()) {
            if (cur._keyed_resources?.[earlier.id] !== keyed.fingerprint) {
              throw new ApiError('idempotency.conflict', 'this Idempotency-Key was already used with a different request');
            }
            out = earlier;
            return null;
          }
          // Made by an earlier use of the key whose record has lapsed: the key is free again.
          r = { ...r, id: deps.sessions.newResource({}).id };
        }
        if (cur.archived_at !== null) throw new ApiError('runtime.invalid_transition', 'an archived session cannot be changed');
        if (cur.resources.length >= 64) throw new ApiError('validation.malformed', 'a session holds at most 64 resources');
        refuseSecondMemoryStore(cur.resources, r, 'body');
        out = r;
        const resources = [...cur.resources, r];
        return { ...cur, resources, ...(keyed || cur._keyed_resources ? { _keyed_resources: keptFingerprints(cur._keyed_resources, resources, keyed && r.id, keyed?.fingerprint) } : {}) };
      });
      crashPoint('session-resource-added');
      return json(201, out);
    },
  }),
  workspaceRead({
    operationId: 'sessions.getResource', path: '/v1/sessions/{session_id}/resources/{resource_id}', summary: 'Read a Session Resource',
    auth: readers, params: ResourcePath, response: ResourceSchema, mcp: 'full',
  }, async (ws, { params, deps }) => {
    const s = await liveSession(deps, ws, params.session_id);
    const r = s.resources.find((x) => x.id === params.resource_id);
    if (!r) throw new ApiError('validation.not_found', 'resource not found');
    return r;
  }),
  defineOperation({
    operationId: 'sessions.updateResource', method: 'POST', path: '/v1/sessions/{session_id}/resources/{resource_id}', summary: 'Update a Session Resource',
    audit: { target: 'resource_id' },
    auth: writers, params: ResourcePath, body: ResourceUpdate, response: ResourceSchema, idempotency: 'optional', mcp: 'full',
    erasureSafe: resourceReplay,
    async handler({ caller, params, body, deps }) {
      let out: unknown = null;
      await deps.sessions.store.update(requireWorkspace(caller), params.session_id, (cur) => {
        if (cur.archived_at !== null) throw new ApiError('runtime.invalid_transition', 'an archived session cannot be changed');
        const r = cur.resources.find((x) => x.id === params.resource_id);
        if (!r) throw new ApiError('validation.not_found', 'resource not found');
        if (body.ref !== undefined && r.type !== 'repository') throw new ApiError('validation.malformed', 'body.ref: only repository resources have a ref');
        if (body.access !== undefined && r.type !== 'memory') throw new ApiError('validation.malformed', 'body.access: only memory resources have an access mode');
        if (body.mount_path !== undefined && r.type === 'memory') throw new ApiError('validation.malformed', 'body.mount_path: memory resources are not mounted');
        checkMountPath(r.type, body.mount_path, 'body.mount_path');
        const next = { ...r, ...body, version: r.version + 1, updated_at: new Date().toISOString() };
        out = next;
        return { ...cur, resources: cur.resources.map((x) => (x.id === r.id ? next : x)) };
      });
      return json(200, out);
    },
  }),
  defineOperation({
    operationId: 'sessions.deleteResource', method: 'DELETE', path: '/v1/sessions/{session_id}/resources/{resource_id}', summary: 'Remove a Resource from a Session',
    audit: { target: 'resource_id' },
    auth: writers, params: ResourcePath, response: Obj({ id: Id('resource'), type: Type.Literal('session_resource_deleted') }), mcp: 'full',
    async handler({ caller, params, deps }) {
      await deps.sessions.store.update(requireWorkspace(caller), params.session_id, (cur) => {
        if (cur.archived_at !== null) throw new ApiError('runtime.invalid_transition', 'an archived session cannot be changed');
        if (!cur.resources.some((x) => x.id === params.resource_id)) throw new ApiError('validation.not_found', 'resource not found');
        const resources = cur.resources.filter((x) => x.id !== params.resource_id);
        return { ...cur, resources, ...(cur._keyed_resources ? { _keyed_resources: keptFingerprints(cur._keyed_resources, resources) } : {}) };
      });
      return json(200, { id: params.resource_id, type: 'session_resource_deleted' });
    },
  }),

  // ---- events ----
  defineOperation({
    operationId: 'sessions.sendEvent', method: 'POST', path: '/v1/sessions/{session_id}/events', summary: 'Send one drive event to a Session',
    audit: { target: 'session_id' },
    auth: { ...writers, principal: true }, permission: { action: 'steer', target: 'session_id', authorIsCaller: true }, actionPolicy: 'drive',
    params: SessionPath, body: DriveEventBody, response: EventSchema, successStatus: 201, idempotency: 'optional', mcp: 'compact',
    erasureSafe: eventReplay,
    async handler({ caller, params, body, idempotencyKey, deps, trace }) {
      const payload = checkDrivePayload(body.type, body.payload);
      const s = await deps.sessions.store.getShared(requireWorkspace(caller), params.session_id);
      const { status, event } = await deps.sessions.drive(s, { type: body.type, payload }, idempotencyKey, trace);
      return json(status, event);
    },
  }),
  defineOperation({
    operationId: 'sessions.streamEvents', method: 'GET', path: '/v1/sessions/{session_id}/events/stream',
    summary: 'SSE: replay after Last-Event-ID, then live', auth: { ...readers, principal: true },
    permission: { action: 'observe', target: 'session_id' }, params: SessionPath, query: StreamQuery, mcp: 'never',
    async handler({ caller, params, query, headers, deps, stillAllowed }) {
      const doc = await deps.sessions.store.getOrTombstone(requireWorkspace(caller), params.session_id);
      // The condensed Session view: child threads show only their status events (their thread streams have the rest).
      const primary = doc.type === 'session' ? doc._primary_thread_id : null;
      const condensed = (thread: string | null, type: string) => primary === null || thread === null || thread === primary || type.startsWith('session.');
      const deltas = deltaFilter(query.event_deltas);
      return sseStream({
        sessionId: params.session_id, cursor: await checkedCursor(deps.sessions.store.log, params.session_id, headers['last-event-id'], query.last_event_id),
        filter: (e) => condensed(e.session_thread_id, e.type),
        deltas: deltas ? (d) => deltas(d) && condensed(d.session_thread_id, d.type) : null, erased: doc.type === 'session_tombstone', log: deps.sessions.store.log, hub: deps.eventHub,
        shutdown: deps.shutdownSignal, keepaliveMs: deps.config.sseKeepaliveMs, stillAllowed,
      });
    },
  }),
];

export type { LogEvent };
