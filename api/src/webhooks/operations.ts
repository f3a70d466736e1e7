import { ApiError, crashPoint, Id, nowIso, Nullable, Obj, Page, PageQuery, Patch, Timestamp, Type, staleOrAhead } from '@agentplane/core';
import { WEBHOOK_EVENT_TYPES } from '../events/catalog.js';
import { ADMINS, READERS } from '../http/caller.js';
import { priorAttempt } from '../http/keyed-create.js';
import type { Operation } from '../http/operation.js';
import { listWorkspaceDocs, workspaceRead, workspaceWrite } from '../http/workspace-operation.js';
import { ENDPOINTS, publicEndpoint, type EndpointDoc } from './model.js';
import { checkEndpointUrl } from '@agentplane/core';
import type { EgressPolicy } from '@agentplane/core';
import type { ApiDeps } from '../deps.js';

const EndpointPath = Obj({ webhook_endpoint_id: Id('webhookEndpoint') });
/** One name of the event catalog; any other is 400 `validation.malformed` listing the allowed ones. */
const EventType = Type.Union(WEBHOOK_EVENT_TYPES.map((t) => Type.Literal(t)));
const EventTypes = Type.Array(EventType, { maxItems: 64, uniqueItems: true });
const Url = Type.String({ minLength: 8, maxLength: 2048 });
const Description = Nullable(Type.String({ maxLength: 500 }));

/**
 * An endpoint URL as the egress guard accepts it, and with a port a request can reach: port 0
 * names no port (a delivery could only fail), 400 `validation.malformed`.
 */
function endpointUrl(raw: string, egress: EgressPolicy): string {
  const url = checkEndpointUrl(raw, egress);
  if (url.port === '0') throw new ApiError('validation.malformed', 'body.url: port 0 is not a port a delivery can reach');
  return url.toString();
}

const EndpointSchema = Obj({
  id: Id('webhookEndpoint'), type: Type.Literal('webhook_endpoint'), workspace_id: Id('workspace'), url: Type.String(), description: Description,
  event_types: Type.Array(Type.String()), status: Type.Union([Type.Literal('enabled'), Type.Literal('disabled')]),
  disabled_reason: Nullable(Type.Union([Type.Literal('operator'), Type.Literal('delivery_failed')])), disabled_at: Nullable(Timestamp()),
  secret_generation: Type.Integer(), previous_secret_expires_at: Nullable(Timestamp()),
  signing_secret: Type.Optional(Type.String({ description: 'returned once, on create and rotation' })),
  version: Type.Integer(), created_at: Timestamp(), updated_at: Timestamp(),
});
const DeliverySchema = Obj({
  message_id: Type.String(), event_type: Type.String(), session_id: Nullable(Id('session')), seq: Type.Integer(), attempt: Type.Integer(),
  status_code: Type.Integer(), latency_ms: Type.Integer(), outcome: Type.Union([Type.Literal('succeeded'), Type.Literal('failed')]),
  error: Nullable(Type.String()),
  retry_after_ms: Nullable(Type.Integer({ minimum: 0, description: "a 429's or 503's valid Retry-After in ms, capped at one hour: the least wait before the next attempt" })),
  test: Type.Boolean(), at: Timestamp(),
});

/**
 * A response that shows a signing secret is replayed only while its endpoint lives at that
 * secret's generation (a rotation or a delete since: 409, no secret), as for every secret the API
 * shows once (docs/API.md, "Idempotency").
 */
async function endpointSecretReplayable(stored: unknown, deps: ApiDeps): Promise<boolean> {
  const s = stored as { id: string; workspace_id: string; secret_generation: number };
  const live = await deps.webhooks.store.find(s.workspace_id, s.id);
  return live !== null && live.secret_generation === s.secret_generation;
}

export const webhookOperations: Operation[] = [
  workspaceWrite('POST', {
    operationId: 'webhookEndpoints.createWebhookEndpoint', path: '/v1/webhook-endpoints',
    summary: 'Create an outbound webhook endpoint; its signing secret is returned once', auth: { kind: 'bearer', roles: ADMINS },
    audit: { target: 'response' }, body: Obj({ url: Url, event_types: Type.Optional(EventTypes), description: Type.Optional(Description) }),
    response: EndpointSchema, successStatus: 201, idempotency: 'optional', sensitive: true, mcp: 'never', replayable: endpointSecretReplayable,
  }, async (ws, { body, deps, keyed }) => {
    const url = endpointUrl(body.url, deps.config.webhooks.egress);
    const now = nowIso();
    // A keyed retry whose first attempt died after writing takes what it wrote; that attempt's
    // signing secret was never shown: a new one replaces it (generation 1) and is shown once here.
    const { id, earlier } = await priorAttempt('webhookEndpoint', keyed, (id) => deps.webhooks.store.find(ws, id));
    const e: EndpointDoc = earlier ?? {
      id, type: 'webhook_endpoint', workspace_id: ws, url, description: body.description ?? null,
      event_types: body.event_types ?? [], status: 'enabled', disabled_reason: null, disabled_at: null, secret_generation: 1,
      previous_secret_expires_at: null, version: 1, created_at: now, updated_at: now,
    };
    const secret = await deps.webhooks.store.create(e);
    crashPoint('webhook-endpoint-created');
    deps.webhooks.forget(ws);
    return { ...publicEndpoint(e), signing_secret: secret };
  }),
  workspaceRead({
    operationId: 'webhookEndpoints.listWebhookEndpoints', path: '/v1/webhook-endpoints',
    summary: 'List webhook endpoints, oldest first', auth: { kind: 'bearer', roles: READERS }, query: PageQuery({}), response: Page(EndpointSchema), mcp: 'full',
  }, (ws, { query, deps }) => listWorkspaceDocs<EndpointDoc>(deps, ws, ENDPOINTS, query)),
  workspaceRead({
    operationId: 'webhookEndpoints.getWebhookEndpoint', path: '/v1/webhook-endpoints/{webhook_endpoint_id}',
    summary: 'Read a webhook endpoint (never its secret)', auth: { kind: 'bearer', roles: READERS }, params: EndpointPath, response: EndpointSchema, mcp: 'full',
  }, async (ws, { params, deps }) => publicEndpoint(await deps.webhooks.store.get(ws, params.webhook_endpoint_id))),
  workspaceWrite('POST', {
    operationId: 'webhookEndpoints.updateWebhookEndpoint', path: '/v1/webhook-endpoints/{webhook_endpoint_id}',
    summary: 'Change a webhook endpoint (compare-and-swap); `status: enabled` resumes deliveries where they stopped',
    auth: { kind: 'bearer', roles: ADMINS }, audit: { target: 'webhook_endpoint_id' }, params: EndpointPath,
    body: Patch({
      expected_version: Type.Integer({ minimum: 1 }), url: Type.Optional(Url), event_types: Type.Optional(EventTypes), description: Type.Optional(Description),
      status: Type.Optional(Type.Union([Type.Literal('enabled'), Type.Literal('disabled')])),
    }),
    response: EndpointSchema, idempotency: 'optional', mcp: 'full',
  }, async (ws, { params, body, deps }) => {
    const url = body.url !== undefined ? endpointUrl(body.url, deps.config.webhooks.egress) : undefined;
    const before = await deps.webhooks.store.get(ws, params.webhook_endpoint_id);
    const next = await deps.webhooks.store.update(ws, params.webhook_endpoint_id, (cur) => ({
      ...cur,
      ...(url !== undefined ? { url } : {}),
      ...(body.event_types !== undefined ? { event_types: body.event_types } : {}),
      ...(body.description !== undefined ? { description: body.description } : {}),
      ...(body.status === 'enabled' ? { status: 'enabled' as const, disabled_reason: null, disabled_at: null } : {}),
      ...(body.status === 'disabled' && cur.status !== 'disabled' ? { status: 'disabled' as const, disabled_reason: 'operator' as const, disabled_at: nowIso() } : {}),
    }), body.expected_version, true);
    deps.webhooks.forget(ws);
    if (before.status === 'disabled' && next.status === 'enabled') await deps.webhooks.resume(ws, next.id);
    return publicEndpoint(next);
  }),
  workspaceWrite('DELETE', {
    operationId: 'webhookEndpoints.deleteWebhookEndpoint', path: '/v1/webhook-endpoints/{webhook_endpoint_id}',
    summary: 'Delete a webhook endpoint, its cursors and its delivery log', auth: { kind: 'bearer', roles: ADMINS },
    audit: { target: 'webhook_endpoint_id' }, params: EndpointPath, query: Obj({ expected_version: Type.Optional(Type.Integer({ minimum: 1 })) }),
    response: Obj({ id: Id('webhookEndpoint'), type: Type.Literal('webhook_endpoint_deleted') }), mcp: 'full',
  }, async (ws, { params, query, deps }) => {
    await deps.webhooks.store.remove(ws, params.webhook_endpoint_id, query.expected_version);
    deps.webhooks.forget(ws);
    return { id: params.webhook_endpoint_id, type: 'webhook_endpoint_deleted' };
  }),
  workspaceWrite('POST', {
    operationId: 'webhookEndpoints.rotateWebhookEndpointSecret', path: '/v1/webhook-endpoints/{webhook_endpoint_id}/rotate-secret',
    summary: 'Issue a new signing secret (returned once); deliveries carry both signatures for overlap_seconds',
    auth: { kind: 'bearer', roles: ADMINS }, audit: { target: 'webhook_endpoint_id' }, params: EndpointPath,
    body: Obj({ expected_version: Type.Integer({ minimum: 1 }), overlap_seconds: Type.Optional(Type.Integer({ minimum: 0, maximum: 7 * 24 * 3600 })) }),
    response: EndpointSchema, idempotency: 'optional', sensitive: true, mcp: 'never', replayable: endpointSecretReplayable,
  }, async (ws, { params, body, deps }) => {
    const r = await deps.webhooks.store.rotateSecret(ws, params.webhook_endpoint_id, body.expected_version, (body.overlap_seconds ?? 24 * 3600) * 1000);
    return { ...publicEndpoint(r.doc), signing_secret: r.secret };
  }),
  workspaceWrite('POST', {
    operationId: 'webhookEndpoints.testWebhookEndpoint', path: '/v1/webhook-endpoints/{webhook_endpoint_id}/test',
    summary: 'Send one synthetic webhook.test delivery (seq 0, session_id null) to the endpoint at expected_version',
    auth: { kind: 'bearer', roles: ADMINS }, audit: { target: 'webhook_endpoint_id' }, params: EndpointPath,
    body: Obj({ expected_version: Type.Integer({ minimum: 1 }) }),
    response: Obj({ delivered: Type.Boolean(), status_code: Type.Integer() }), idempotency: 'optional', mcp: 'full',
  }, async (ws, { params, body, deps }) => {
    const e = await deps.webhooks.store.get(ws, params.webhook_endpoint_id);
    if (e.version !== body.expected_version) throw new ApiError('validation.conflict', `version ${body.expected_version} ${staleOrAhead(body.expected_version, e.version)}; the current version is ${e.version}`);
    return deps.webhooks.test(e);
  }),
  workspaceRead({
    operationId: 'webhookEndpoints.listWebhookDeliveries', path: '/v1/webhook-endpoints/{webhook_endpoint_id}/deliveries',
    summary: 'The delivery log of an endpoint, newest first: every attempt with its status code and latency (the last 1,000 kept)',
    auth: { kind: 'bearer', roles: READERS }, params: EndpointPath, query: PageQuery({}, 1000), response: Page(DeliverySchema), mcp: 'full',
  }, async (ws, { params, query, deps }) => {
    await deps.webhooks.store.get(ws, params.webhook_endpoint_id);
    return deps.webhooks.store.deliveries(ws, params.webhook_endpoint_id, query.limit ?? 20, query.page);
  }),
];
