import type { IncomingMessage } from 'node:http';
import getRawBody from 'raw-body';
import { ApiError, Id, Obj, Type } from '@agentplane/core';
import { defineOperation, json, type Operation, type UploadBody } from '../http/operation.js';

const MAX_BODY = 64 * 1024;

/** A push notification's body: read (bounded) and discarded; only its arrival matters. */
const notificationBody: UploadBody = {
  contentType: 'application/a2a+json',
  schema: Type.Unsafe<unknown>({ description: 'the peer\'s A2A task notification; read and discarded (at most 64 KiB)' }),
  async receive(stream: IncomingMessage): Promise<Record<string, unknown>> {
    const type = (stream.headers['content-type'] ?? '').split(';')[0]?.trim().toLowerCase();
    if (type !== 'application/a2a+json' && type !== 'application/json') throw new ApiError('validation.malformed', 'a notification is application/a2a+json');
    try {
      await getRawBody(stream, { limit: MAX_BODY });
    } catch (err) {
      if ((err as { type?: string }).type === 'entity.too.large') throw new ApiError('validation.payload_too_large', `a notification is at most ${MAX_BODY} bytes`);
      throw new ApiError('validation.malformed', 'the notification body could not be read');
    }
    return {};
  },
  fingerprint: () => ({}),
  discard: async () => undefined,
};

const CallbackPath = Obj({ session_id: Id('session'), tool_use_id: Id('toolUse') });

/**
 * `POST /v1/a2a-tool-callbacks/{session_id}/{tool_use_id}`: the task-scoped push callback an
 * external A2A peer notifies. Authenticated only by the call's generated Bearer value (its
 * digest is stored with the call), not by an API key; an operation like any other, so it is
 * validated, rate-limited by the pipeline's rules for anonymous callers and audited in the
 * call's Workspace. A notification only wakes the call's observer, which re-reads the task with
 * GetTask; its body is never trusted for the result.
 */
export const a2aCallbackOperations: Operation[] = [
  defineOperation({
    operationId: 'toolSources.notifyA2aToolCall', method: 'POST', path: '/v1/a2a-tool-callbacks/{session_id}/{tool_use_id}',
    summary: "An external A2A peer's push notification for one tool call (the call's generated Bearer value; no API key): wakes the call, which re-reads the task",
    auth: { kind: 'none' }, versions: null, audit: { target: 'tool_use_id' }, params: CallbackPath, upload: notificationBody,
    response: Obj({ workspace_id: Id('workspace'), session_id: Id('session'), tool_use_id: Id('toolUse'), woken: Type.Literal(true) }),
    mcp: 'never',
    async handler({ params, headers, deps }) {
      const auth = /^Bearer ([A-Za-z0-9_-]{20,200})$/.exec(headers.authorization ?? '');
      const workspaceId = auth?.[1] ? await deps.a2aCalls.notify(params.session_id, params.tool_use_id, auth[1]) : null;
      if (!workspaceId) throw new ApiError('auth.invalid_key', 'unknown call or callback credential');
      return json(200, { workspace_id: workspaceId, session_id: params.session_id, tool_use_id: params.tool_use_id, woken: true as const });
    },
  }),
];
