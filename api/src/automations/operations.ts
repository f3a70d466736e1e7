import { ApiError, crashPoint, Id, nowIso, Obj, Page, PageQuery, Type } from '@agentplane/core';
import { keys, tags } from '@agentplane/store';
import { READERS, WRITERS } from '../http/caller.js';
import { createOnce, priorAttempt } from '../http/keyed-create.js';
import { defineOperation, json, type Operation } from '../http/operation.js';
import { listWorkspaceDocs, workspaceRead, workspaceWrite } from '../http/workspace-operation.js';
import { requireWorkspace } from '../http/workspace-scope.js';
import type { ApiDeps } from '../deps.js';
import { checkCron } from './cron.js';
import { MAX_PROMPT_BYTES } from './prompt.js';
import { acceptDelivery, deliveryBody, deliveryText, verifyDelivery } from './ingest.js';
import { parseLimitedJson } from './json-limits.js';
import { buildTrace } from './trace.js';
import { newSigningSecret } from './store.js';
import {
  AUTOMATIONS, feedbackOf, firingsOf, publicAutomation, publicFeedback, publicFiring, TERMINAL_FIRING,
  type AutomationDoc, type FeedbackDoc, type FiringDoc, type Trigger,
} from './model.js';
import {
  AutomationSchema, CreateAutomationBody, Disposition, FeedbackSchema, FiringSchema, TraceSchema, UpdateAutomationBody,
} from './schemas.js';
import type { Static } from '@agentplane/core';

const AutomationPath = Obj({ automation_id: Id('automation') });
const FiringPath = Obj({ firing_id: Id('automationFiring') });
const VersionBody = Obj({ expected_version: Type.Integer({ minimum: 1 }) });
const DEFAULT_OVERLAP_SECONDS = 24 * 3600;

function checkTrigger(input: Static<typeof CreateAutomationBody>['trigger']): Trigger {
  if (input.type === 'webhook') return { type: 'webhook' };
  if (input.type === 'subscription') {
    if (input.event === 'session.turn_ended') {
      const f = input.filter as { stop_reasons?: string[]; agent_ids?: string[] } | undefined;
      if (f?.stop_reasons?.includes('requires_action')) throw new ApiError('validation.malformed', 'body.trigger.filter.stop_reasons: requires_action does not end a turn');
      return { type: 'subscription', event: 'session.turn_ended', filter: { stop_reasons: f?.stop_reasons ?? [], agent_ids: f?.agent_ids ?? [] } };
    }
    const f = input.filter as { webhook_endpoint_ids?: string[] } | undefined;
    return { type: 'subscription', event: 'webhook_endpoint.disabled', filter: { webhook_endpoint_ids: f?.webhook_endpoint_ids ?? [] } };
  }
  const on_missed = input.on_missed ?? 'fire_once';
  if ('interval_seconds' in input) return { type: 'schedule', interval_seconds: input.interval_seconds, on_missed };
  const timezone = input.timezone ?? 'UTC';
  checkCron(input.cron, timezone);
  return { type: 'schedule', cron: input.cron, timezone, on_missed };
}

function checkPrompt(prompt: string): void {
  if (Buffer.byteLength(prompt, 'utf8') > MAX_PROMPT_BYTES) throw new ApiError('validation.malformed', `body.prompt exceeds ${MAX_PROMPT_BYTES} bytes`);
}

async function checkRefs(deps: ApiDeps, ws: string, r: { principal_id?: string | undefined; agent?: AutomationDoc['agent'] | undefined; environment_id?: string | undefined }): Promise<void> {
  if (r.principal_id) {
    const p = await deps.identity.activePrincipal(ws, r.principal_id, 'principal_id');
    if (p.principal_type !== 'service') throw new ApiError('validation.malformed', 'body.principal_id: an Automation executes as a service Principal');
  }
  if (r.agent) {
    if (r.agent.version === null) {
      // Each firing starts a Session of the Agent's current version, which an archived Agent
      // refuses: such an Automation could never fire (409, as a Session's create says).
      const agent = await deps.agents.get(ws, r.agent.id);
      if (agent.archived_at !== null) throw new ApiError('runtime.invalid_transition', `body.agent: agent ${r.agent.id} is archived; its Sessions start only at a pinned version`);
    } else {
      await deps.agents.getVersion(ws, r.agent.id, r.agent.version);
    }
  }
  if (r.environment_id) {
    const env = await deps.environments.get(ws, r.environment_id);
    if (env.archived_at !== null) throw new ApiError('runtime.invalid_transition', `body.environment_id: environment ${r.environment_id} is archived`);
  }
}

/**
 * The ids a subscription's filter names must be of this Workspace: an Agent or endpoint of another
 * one (or none) could never match, so the Automation would never fire. 404 `validation.not_found`.
 */
async function checkFilterRefs(deps: ApiDeps, ws: string, trigger: Trigger | undefined): Promise<void> {
  if (trigger?.type !== 'subscription') return;
  const named = async (field: string, what: string, id: string, get: () => Promise<unknown>): Promise<void> => {
    try {
      await get();
    } catch (err) {
      if (err instanceof ApiError && err.type === 'validation.not_found') throw new ApiError('validation.not_found', `body.trigger.filter.${field}: ${what} ${id} not found`);
      throw err;
    }
  };
  if (trigger.event === 'session.turn_ended') {
    for (const id of trigger.filter.agent_ids) await named('agent_ids', 'agent', id, () => deps.agents.get(ws, id));
  } else {
    for (const id of trigger.filter.webhook_endpoint_ids) await named('webhook_endpoint_ids', 'webhook endpoint', id, () => deps.webhooks.store.get(ws, id));
  }
}

const agentRef = (a: string | { id: string; version?: number | null | undefined }): AutomationDoc['agent'] =>
  typeof a === 'string' ? { id: a, version: null } : { id: a.id, version: a.version ?? null };

async function view(deps: ApiDeps, a: AutomationDoc, extra: Record<string, unknown> = {}): Promise<Record<string, unknown>> {
  const [next, metrics] = await Promise.all([
    a.trigger.type === 'schedule' && a.status === 'active' ? deps.automations.nextScheduledAt(a.id) : Promise.resolve(null),
    deps.automations.store.metrics(a.workspace_id, a.id),
  ]);
  return { ...publicAutomation(a), next_fire_at: next, metrics, ...extra };
}

async function firingOf(deps: ApiDeps, ws: string, id: string): Promise<FiringDoc> {
  return deps.automations.store.firing(ws, id);
}

/**
 * A response that shows a webhook trigger's signing secret is replayed only while the Automation
 * lives at that secret's generation (a rotation or a delete since: 409, no secret), as for every
 * secret the API shows once (docs/API.md, "Idempotency"). One without a secret replays as stored.
 */
async function automationSecretReplayable(stored: unknown, deps: ApiDeps): Promise<boolean> {
  const s = stored as { id: string; workspace_id: string; signing_secret?: string; webhook: { secret_generation: number } | null };
  if (s.signing_secret === undefined) return true;
  const live = await deps.automations.store.find(s.workspace_id, s.id);
  return live !== null && live.webhook !== null && live.webhook.secret_generation === s.webhook?.secret_generation;
}

export const automationOperations: Operation[] = [
  workspaceWrite('POST', {
    operationId: 'automations.createAutomation', path: '/v1/automations',
    summary: 'Create an Automation (schedule or signed-webhook trigger); a webhook trigger returns its signing secret once',
    auth: { kind: 'bearer', roles: WRITERS }, audit: { target: 'response' },
    body: CreateAutomationBody, response: AutomationSchema, successStatus: 201, idempotency: 'optional', sensitive: true, mcp: 'never', replayable: automationSecretReplayable,
  }, async (ws, { body, deps, keyed }) => {
    checkPrompt(body.prompt);
    const trigger = checkTrigger(body.trigger);
    const agent = agentRef(body.agent);
    await checkRefs(deps, ws, { principal_id: body.principal_id, agent, environment_id: body.environment_id });
    await checkFilterRefs(deps, ws, trigger);
    const now = nowIso();
    // A keyed retry whose first attempt died after writing takes what it wrote, and finishes its
    // create (the steps below are idempotent). That attempt's signing secret was never shown: a new
    // one replaces it (generation 1, as the unchanged Automation says) and is shown once here.
    const { id, earlier } = await priorAttempt('automation', keyed, (id) => deps.automations.store.find(ws, id));
    const a: AutomationDoc = earlier ?? {
      id, type: 'automation', workspace_id: ws, name: body.name, status: 'active', principal_id: body.principal_id, agent,
      environment_id: body.environment_id, prompt: body.prompt,
      budget: body.budget ? { max_list_cost: { amount: body.budget.max_list_cost.amount, currency: 'USD' } } : null,
      max_concurrent_firings: body.max_concurrent_firings ?? 1, trigger,
      webhook: trigger.type === 'webhook' ? { ingest_path: `/v1/ingest/automations/${id}`, secret_generation: 1, previous_secret_expires_at: null } : null,
      version: 1, created_at: now, updated_at: now,
    };
    const secret = trigger.type === 'webhook' ? newSigningSecret() : null;
    await deps.automations.store.create(a, secret);
    crashPoint('automation-created');
    if (trigger.type === 'subscription') await deps.automations.subscribed(ws);
    await deps.automations.syncSchedule(ws, a.id);
    return view(deps, a, secret ? { signing_secret: secret } : {});
  }),
  workspaceRead({
    operationId: 'automations.listAutomations', path: '/v1/automations',
    summary: 'List Automations, oldest first', auth: { kind: 'bearer', roles: READERS },
    query: PageQuery({}), response: Page(AutomationSchema), mcp: 'full',
  }, async (ws, { query, deps }) => {
    const page = await listWorkspaceDocs<AutomationDoc>(deps, ws, AUTOMATIONS, query);
    return { data: await Promise.all(page.data.map((a) => view(deps, a))), next_page: page.next_page };
  }),
  workspaceRead({
    operationId: 'automations.getAutomation', path: '/v1/automations/{automation_id}',
    summary: 'Read an Automation with its next scheduled fire and its metrics', auth: { kind: 'bearer', roles: READERS },
    params: AutomationPath, response: AutomationSchema, mcp: 'full',
  }, async (ws, { params, deps }) => view(deps, await deps.automations.store.get(ws, params.automation_id))),
  defineOperation({
    operationId: 'automations.updateAutomation', method: 'POST', path: '/v1/automations/{automation_id}',
    summary: 'Change an Automation (compare-and-swap on expected_version); a schedule change updates its scheduler',
    auth: { kind: 'bearer', roles: WRITERS }, audit: { target: 'automation_id' }, params: AutomationPath,
    body: UpdateAutomationBody, response: AutomationSchema, idempotency: 'optional', mcp: 'full',
    async handler({ caller, params, body, deps }) {
      const ws = requireWorkspace(caller);
      if (body.prompt !== undefined) checkPrompt(body.prompt);
      const trigger = body.trigger ? checkTrigger(body.trigger) : undefined;
      const agent = body.agent ? agentRef(body.agent) : undefined;
      await checkRefs(deps, ws, { principal_id: body.principal_id, agent, environment_id: body.environment_id });
      await checkFilterRefs(deps, ws, trigger);
      const next = await deps.automations.store.update(ws, params.automation_id, (cur) => {
        if (trigger && trigger.type !== cur.trigger.type) {
          throw new ApiError('validation.malformed', 'body.trigger: the kind of trigger (schedule, webhook or subscription) is fixed when the Automation is created');
        }
        return {
          ...cur,
          ...(body.name !== undefined ? { name: body.name } : {}),
          ...(body.principal_id !== undefined ? { principal_id: body.principal_id } : {}),
          ...(agent ? { agent } : {}),
          ...(body.environment_id !== undefined ? { environment_id: body.environment_id } : {}),
          ...(body.prompt !== undefined ? { prompt: body.prompt } : {}),
          ...(body.budget !== undefined ? { budget: body.budget ? { max_list_cost: { amount: body.budget.max_list_cost.amount, currency: 'USD' as const } } : null } : {}),
          ...(body.max_concurrent_firings !== undefined ? { max_concurrent_firings: body.max_concurrent_firings } : {}),
          ...(trigger ? { trigger } : {}),
        };
      }, body.expected_version);
      await deps.automations.syncSchedule(ws, next.id);
      return json(200, await view(deps, next));
    },
  }),
  workspaceWrite('DELETE', {
    operationId: 'automations.deleteAutomation', path: '/v1/automations/{automation_id}',
    summary: 'Delete an Automation and its scheduler; its firings stay readable', auth: { kind: 'bearer', roles: WRITERS },
    audit: { target: 'automation_id' }, params: AutomationPath, query: Obj({ expected_version: Type.Optional(Type.Integer({ minimum: 1 })) }),
    response: Obj({ id: Id('automation'), type: Type.Literal('automation_deleted') }), mcp: 'full',
  }, async (ws, { params, query, deps }) => {
    // The document first: a crash after it leaves a scheduler the reconciliation removes.
    await deps.automations.store.remove(ws, params.automation_id, query.expected_version);
    await deps.automations.syncSchedule(ws, params.automation_id);
    return { id: params.automation_id, type: 'automation_deleted' };
  }),
  ...(['pause', 'resume'] as const).map((verb) => defineOperation({
    operationId: `automations.${verb}Automation`, method: 'POST', path: `/v1/automations/{automation_id}/${verb}`,
    summary: verb === 'pause'
      ? 'Pause an Automation: its scheduler is removed and deliveries are refused until resumed (compare-and-swap)'
      : 'Resume a paused Automation: its scheduler is restored (compare-and-swap)',
    auth: { kind: 'bearer', roles: WRITERS }, audit: { target: 'automation_id' }, params: AutomationPath,
    body: VersionBody, response: AutomationSchema, idempotency: 'optional', mcp: 'full',
    async handler({ caller, params, body, deps }) {
      const ws = requireWorkspace(caller);
      const status = verb === 'pause' ? 'paused' : 'active';
      const next = await deps.automations.store.update(ws, params.automation_id, (cur) => (cur.status === status ? null : { ...cur, status }), body.expected_version);
      await deps.automations.syncSchedule(ws, next.id);
      return json(200, await view(deps, next));
    },
  })),
  workspaceWrite('POST', {
    operationId: 'automations.rotateAutomationSecret', path: '/v1/automations/{automation_id}/rotate-secret',
    summary: 'Issue a new webhook signing secret (returned once); the previous one keeps verifying for overlap_seconds',
    auth: { kind: 'bearer', roles: WRITERS }, audit: { target: 'automation_id' }, params: AutomationPath,
    body: Obj({ expected_version: Type.Integer({ minimum: 1 }), overlap_seconds: Type.Optional(Type.Integer({ minimum: 0, maximum: 7 * 24 * 3600 })) }),
    response: AutomationSchema, idempotency: 'optional', sensitive: true, mcp: 'never', replayable: automationSecretReplayable,
  }, async (ws, { params, body, deps }) => {
    const overlapMs = (body.overlap_seconds ?? DEFAULT_OVERLAP_SECONDS) * 1000;
    const r = await deps.automations.store.rotateSecret(ws, params.automation_id, body.expected_version, overlapMs);
    return view(deps, r.doc, { signing_secret: r.secret });
  }),
  workspaceWrite('POST', {
    operationId: 'automations.fireAutomation', path: '/v1/automations/{automation_id}/fire',
    summary: 'Fire an Automation by hand (source.kind = manual): returns the firing receipt (status pending)',
    auth: { kind: 'bearer', roles: WRITERS }, audit: { target: 'automation_id' }, params: AutomationPath,
    body: Obj({ event: Type.Optional(Type.Unsafe<unknown>({ description: 'any JSON value: {{event}} in the prompt' })) }),
    response: FiringSchema, successStatus: 202, idempotency: 'optional', mcp: 'full',
  }, async (ws, { params, body, deps }) => {
    const a = await deps.automations.store.get(ws, params.automation_id);
    if (a.status !== 'active') throw new ApiError('runtime.invalid_transition', 'the automation is paused; resume it first');
    const f = await deps.automations.fire(a, { kind: 'manual' }, body.event ?? {});
    return publicFiring(f);
  }),
  workspaceRead({
    operationId: 'automations.listAutomationFirings', path: '/v1/automations/{automation_id}/firings',
    summary: 'List the firings of an Automation, oldest first unless order=desc (also once it is deleted); filter by status and source',
    auth: { kind: 'bearer', roles: READERS }, params: AutomationPath,
    query: PageQuery({
      status: Type.Optional(Type.Union(['pending', 'running', 'completed', 'refused', 'skipped', 'failed'].map((s) => Type.Literal(s)))),
      source: Type.Optional(Type.Union([Type.Literal('manual'), Type.Literal('schedule'), Type.Literal('webhook'), Type.Literal('subscription')])),
      order: Type.Optional(Type.Union([Type.Literal('asc'), Type.Literal('desc')], { default: 'asc' })),
    }),
    response: Page(FiringSchema), mcp: 'full',
  }, async (ws, { params, query, deps }) => {
    const { status, source } = query;
    const filter = status || source ? (f: FiringDoc) => (!status || f.status === status) && (!source || f.source.kind === source) : undefined;
    // An Automation not in this Workspace is a 404, as for every other sub-collection. A deleted
    // one's firings stay listed: the Workspace's firings index of that Automation says it was here.
    const [found, page] = await Promise.all([
      deps.automations.store.docs.get<AutomationDoc>(tags.workspace(ws), params.automation_id),
      deps.docs.list<FiringDoc>(tags.workspace(ws), firingsOf(params.automation_id), { limit: query.limit ?? 20, page: query.page, order: query.order ?? 'asc' }, filter),
    ]);
    if (!found && (await deps.redis.exists(keys.index(tags.workspace(ws), firingsOf(params.automation_id)))) === 0) {
      throw new ApiError('validation.not_found', `automation ${params.automation_id} not found`);
    }
    return { data: page.data.map(publicFiring), next_page: page.next_page };
  }),
  workspaceRead({
    operationId: 'automationFirings.getAutomationFiring', path: '/v1/automation-firings/{firing_id}',
    summary: 'Read a firing receipt', auth: { kind: 'bearer', roles: READERS }, params: FiringPath, response: FiringSchema, mcp: 'full',
  }, async (ws, { params, deps }) => publicFiring(await firingOf(deps, ws, params.firing_id))),
  workspaceRead({
    operationId: 'automationFirings.getAutomationFiringTrace', path: '/v1/automation-firings/{firing_id}/trace',
    summary: 'The content-free trace of one firing in any state', auth: { kind: 'bearer', roles: READERS },
    params: FiringPath, response: TraceSchema, mcp: 'full',
  }, async (ws, { params, deps }) => {
    const f = await firingOf(deps, ws, params.firing_id);
    return buildTrace(f, deps.sessions, await deps.automations.store.feedbackCounts(ws, f.id));
  }),
  workspaceRead({
    operationId: 'automationFirings.listAutomationFiringFeedback', path: '/v1/automation-firings/{firing_id}/feedback',
    summary: 'Feedback labels of one submitted (finished) firing, oldest first; 409 while the firing is still pending or running',
    auth: { kind: 'bearer', roles: READERS }, params: FiringPath, query: PageQuery({}), response: Page(FeedbackSchema), mcp: 'full',
  }, async (ws, { params, query, deps }) => {
    const f = await firingOf(deps, ws, params.firing_id);
    if (!TERMINAL_FIRING.has(f.status)) throw new ApiError('runtime.invalid_transition', `the firing is ${f.status}: feedback is for finished firings`);
    const page = await listWorkspaceDocs<FeedbackDoc>(deps, ws, feedbackOf(f.id), query);
    return { ...page, data: page.data.map(publicFeedback) };
  }),
  workspaceWrite('POST', {
    operationId: 'automationFirings.createAutomationFiringFeedback', path: '/v1/automation-firings/{firing_id}/feedback',
    summary: 'Label a finished firing (useful, noisy, incorrect, too_late, already_handled); one label per Principal, no free text',
    auth: { kind: 'bearer', roles: WRITERS }, audit: { target: 'response' }, params: FiringPath,
    body: Obj({ authored_by: Id('principal'), disposition: Disposition }), response: FeedbackSchema, successStatus: 201, idempotency: 'optional', mcp: 'full',
  }, async (ws, { params, body, deps, keyed }) => {
    const f = await firingOf(deps, ws, params.firing_id);
    if (!TERMINAL_FIRING.has(f.status)) throw new ApiError('runtime.invalid_transition', `the firing is ${f.status}: feedback is for finished firings`);
    // Made once per keyed request: the retry of a create that died after writing (crash point
    // `firing-feedback-created`) is answered the label it wrote, not refused for the Principal's
    // label (one per firing; another request for it is still refused).
    const find = async (id: string) => {
      const d = await deps.docs.get<FeedbackDoc>(tags.workspace(ws), id);
      return d && d.type === 'automation_firing_feedback' && d.firing_id === f.id ? d : null;
    };
    return publicFeedback(await createOnce('firingFeedback', keyed, find, async (id) => {
      await deps.identity.activePrincipal(ws, body.authored_by, 'authored_by');
      const now = nowIso();
      const doc: FeedbackDoc = {
        id, type: 'automation_firing_feedback', workspace_id: ws, automation_id: f.automation_id, firing_id: f.id,
        authored_by: body.authored_by, disposition: body.disposition, version: 1, created_at: now, updated_at: now,
      };
      await deps.automations.store.createFeedback(doc);
      return doc;
    }, 'firing-feedback-created'));
  }),
  defineOperation({
    operationId: 'automationFirings.updateAutomationFiringFeedback', method: 'POST', path: '/v1/automation-firings/{firing_id}/feedback/{feedback_id}',
    summary: 'Change a feedback label\'s disposition (compare-and-swap on expected_version)',
    auth: { kind: 'bearer', roles: WRITERS }, audit: { target: 'feedback_id' },
    params: Obj({ firing_id: Id('automationFiring'), feedback_id: Id('firingFeedback') }),
    body: Obj({ expected_version: Type.Integer({ minimum: 1 }), disposition: Disposition }), response: FeedbackSchema, idempotency: 'optional', mcp: 'full',
    async handler({ caller, params, body, deps }) {
      const ws = requireWorkspace(caller);
      const next = await deps.docs.update<FeedbackDoc>(tags.workspace(ws), params.feedback_id, (cur) => {
        if (cur.type !== 'automation_firing_feedback' || cur.firing_id !== params.firing_id) throw new ApiError('validation.not_found', `feedback ${params.feedback_id} not found`);
        return cur.disposition === body.disposition ? null : { ...cur, disposition: body.disposition };
      }, { expectedVersion: body.expected_version, notFound: `feedback ${params.feedback_id}` });
      return json(200, publicFeedback(next));
    },
  }),
  defineOperation({
    operationId: 'automations.ingestAutomationWebhook', method: 'POST', path: '/v1/ingest/automations/{automation_id}',
    summary: 'A signed webhook delivery (Standard Webhooks; no API key): 202 with the firing receipt, 200 with it again for a repeated webhook-id',
    auth: { kind: 'none' }, versions: null, audit: { target: 'automation_id' }, params: AutomationPath,
    upload: deliveryBody, response: FiringSchema, successStatus: 202, mcp: 'never',
    async handler({ params, body, headers, deps }) {
      const raw = (body as { raw?: unknown }).raw;
      const bytes = Buffer.isBuffer(raw) ? raw : Buffer.alloc(0);
      const a = await deps.automations.store.locate(params.automation_id);
      if (!a || a.trigger.type !== 'webhook') throw new ApiError('validation.not_found', `automation ${params.automation_id} not found or has no webhook trigger`);
      verifyDelivery(bytes, headers, await deps.automations.store.verificationSecrets(a.workspace_id, a.id));
      if (await deps.automations.store.tenancyDisabled(a.workspace_id)) throw new ApiError('auth.disabled_tenancy', 'the Workspace of this automation, or its Organization, is disabled');
      const event = parseLimitedJson(deliveryText(bytes));
      const deliveryId = String(headers['webhook-id']);
      const r = await acceptDelivery(deps.automations.store, a.workspace_id, a.id, deliveryId, async (firingId) => {
        if (a.status !== 'active') throw new ApiError('runtime.invalid_transition', 'the automation is paused');
        return deps.automations.fire(a, { kind: 'webhook', delivery_id: deliveryId }, event, { id: firingId });
      });
      if (r.duplicate) return { ...json(200, { ...publicFiring(r.firing), duplicate: true }), replay: true };
      return json(202, publicFiring(r.firing));
    },
  }),
];
