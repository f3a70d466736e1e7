import { Nullable, Obj, Timestamp, Type } from '@agentplane/core';
import { ADMINS } from '../http/caller.js';
import { defineOperation, json, type Operation } from '../http/operation.js';

const AuditRecordSchema = Obj({
  id: Type.Integer({ minimum: 1 }),
  workspace_id: Type.String(),
  actor: Obj({ id: Type.String(), credential_id: Nullable(Type.String()) }),
  action: Type.String(),
  target: Nullable(Type.String()),
  outcome: Type.String(),
  status: Nullable(Type.Integer()),
  detail: Nullable(Type.String()),
  request_id: Nullable(Type.String()),
  time: Timestamp(),
});

const ExportBody = Obj({
  after: Type.Optional(Type.Integer({ minimum: 0, description: 'Return records with a larger id (the previous page\'s next_after).' })),
  limit: Type.Optional(Type.Integer({ minimum: 1, maximum: 1000, default: 100 })),
  since: Type.Optional(Timestamp()),
  until: Type.Optional(Timestamp()),
  actor: Type.Optional(Type.String({ minLength: 1, maxLength: 128, description: 'Principal id or credential id' })),
  target: Type.Optional(Type.String({ minLength: 1, maxLength: 128 })),
  action: Type.Optional(Type.String({ minLength: 1, maxLength: 128 })),
});

export const auditOperations: Operation[] = [
  defineOperation({
    operationId: 'audit.exportAudit', method: 'POST', path: '/v1/audit/export',
    summary: 'Page through the Workspace audit log, oldest first (numeric `next_after`, resent as `after`)',
    auth: { kind: 'bearer', roles: ADMINS }, body: ExportBody,
    response: Obj({ data: Type.Array(AuditRecordSchema), next_after: Nullable(Type.Integer({ minimum: 0 })) }),
    audit: false, mcp: 'full',
    async handler({ caller, body, deps }) {
      const page = await deps.audit.export(caller.workspaceId ?? '', {
        after: body.after ?? 0,
        limit: body.limit ?? 100,
        since: body.since !== undefined ? Date.parse(body.since) : undefined,
        until: body.until !== undefined ? Date.parse(body.until) : undefined,
        actor: body.actor, target: body.target, action: body.action,
      });
      return json(200, page);
    },
  }),
];
