import { ApiError, sha256Hex, type SecretBox, staleOrAhead } from '@agentplane/core';
import { keys, LuaScript, tags, type DocumentStore, type Redis } from '@agentplane/store';
import type { Organization, Workspace } from '@agentplane/domain';
import {
  AUTOMATIONS, feedbackOf, firingsOf, stampScheduleStart, type AutomationDoc, type FeedbackDoc, type FiringDoc,
} from './model.js';
import { TOLERANCE_SECONDS } from './ingest.js';
import { rotateSigningSecret, type SecretRecord } from './signing-secret.js';

export { newSigningSecret } from './signing-secret.js';

/**
 * Delivery ids are remembered for the whole span a timestamp is accepted in (the tolerance either
 * way) and a minute more: a delivery accepted first at the span's start, its timestamp rounded
 * down to the second, is refused by its timestamp before its id is forgotten.
 */
export const DELIVERY_ID_TTL_SECONDS = 2 * TOLERANCE_SECONDS + 60;

/** Admits one more running firing unless the Automation already has `max` (atomic). */
const ADMIT = new LuaScript('automation_admit', `
if redis.call('SISMEMBER', KEYS[1], ARGV[1]) == 1 then return 1 end
if redis.call('SCARD', KEYS[1]) >= tonumber(ARGV[2]) then return 0 end
redis.call('SADD', KEYS[1], ARGV[1])
return 1`);

/**
 * A feedback label and its claim (Principal → label id, one per firing) in one script, so no
 * failure between them can leave a claim without its label (the Principal could never label the
 * firing). A claim whose label is not in the firing's label index (left by a release that wrote
 * them apart) is taken over. KEYS: the claims hash, the label's document, the firing's label
 * index. ARGV: Principal, label id, label JSON, score. Answers the label id already held, or nil.
 */
const CREATE_FEEDBACK = new LuaScript('automation_feedback_create', `
local held = redis.call('HGET', KEYS[1], ARGV[1])
if held and redis.call('ZSCORE', KEYS[3], held) then return held end
if not redis.call('SET', KEYS[2], ARGV[3], 'NX') then return redis.error_reply('feedback label id taken') end
redis.call('ZADD', KEYS[3], ARGV[4], ARGV[2])
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
return false`);

/** Redis keys of the automations area (docs/ARCHITECTURE.md lists them). */
export const automationKeys = {
  secret: (ws: string, id: string) => keys.scoped(tags.workspace(ws), `automation_secret:${id}`),
  running: (ws: string, id: string) => keys.scoped(tags.workspace(ws), `automation_running:${id}`),
  delivery: (ws: string, id: string, deliveryId: string) => keys.scoped(tags.workspace(ws), `automation_delivery:${id}:${sha256Hex(deliveryId)}`),
  metrics: (ws: string, id: string) => keys.scoped(tags.workspace(ws), `automation_metrics:${id}`),
  /** Automation id → its Workspace (the ingest route names only the Automation). */
  home: (id: string) => keys.global(`automation_home:${id}`),
  /** Workspaces with subscription Automations (the event tap looks only at these). */
  subscribers: () => keys.global('automation_subscribers'),
  /** Set once a Workspace's subscription index holds the subscription Automations made before it existed. */
  subscriptionsIndexed: (ws: string) => keys.scoped(tags.workspace(ws), 'automation_subscriptions_indexed'),
  /** `<ws>/<auto>` of every schedule Automation: what the schedule reconciliation walks. */
  schedules: () => keys.global('automation_schedules'),
  /** Firings whose receipt exists but whose work may not be queued yet (swept by every api). */
  outbox: () => keys.global('firing_outbox'),
};

/** The index of a Workspace's subscription Automations (those the event tap fires). */
export const SUBSCRIPTIONS = 'automation_subscriptions';

export class AutomationStore {
  /** Workspaces whose subscription index this process found built. */
  private readonly indexed = new Set<string>();

  constructor(
    readonly redis: Redis,
    readonly docs: DocumentStore,
    private readonly box: SecretBox,
  ) {}

  // ---- automations ---------------------------------------------------------------------------

  /**
   * Writes a new Automation, its first signing secret (webhook triggers) first. Every step may be
   * repeated: for an Automation already written (a keyed create's retry) it writes `secret` as its
   * first one again and leaves the document as it is.
   */
  async create(a: AutomationDoc, secret: string | null): Promise<void> {
    if (secret) await this.writeSecret(a.workspace_id, a.id, { generation: 1, current: this.seal(a.id, secret), previous: null, previous_expires_ms: 0 });
    // Before the document: a crash after it leaves a schedule the reconciliation finds.
    if (a.trigger.type === 'schedule') await this.redis.sadd(automationKeys.schedules(), `${a.workspace_id}/${a.id}`);
    await this.redis.set(automationKeys.home(a.id), a.workspace_id);
    // A subscription is listed in its Workspace's subscription index too, in the same script as
    // its document (the kind of trigger never changes): the event tap reads only those.
    await this.docs.create(tags.workspace(a.workspace_id), a, a.trigger.type === 'subscription' ? [AUTOMATIONS, SUBSCRIPTIONS] : [AUTOMATIONS]);
  }

  /**
   * The ids of the Workspace's subscription Automations (and, after a crash, of one whose create
   * did not finish: its document is missing). A Workspace whose subscriptions were made before
   * the index existed has them indexed first, once.
   */
  async subscriptionIds(ws: string): Promise<string[]> {
    const tag = tags.workspace(ws);
    if (!this.indexed.has(ws)) {
      if (!(await this.redis.exists(automationKeys.subscriptionsIndexed(ws)))) {
        const ids = await this.redis.zrange(keys.index(tag, AUTOMATIONS), 0, -1);
        const subs = (await this.docs.getMany<AutomationDoc>(tag, ids)).filter((a) => a.trigger.type === 'subscription');
        if (subs.length > 0) await this.redis.zadd(keys.index(tag, SUBSCRIPTIONS), ...subs.flatMap((a) => [Date.parse(a.created_at), a.id]));
        await this.redis.set(automationKeys.subscriptionsIndexed(ws), '1');
      }
      if (this.indexed.size >= 100_000) this.indexed.clear();
      this.indexed.add(ws);
    }
    return this.redis.zrange(keys.index(tag, SUBSCRIPTIONS), 0, -1);
  }

  async get(ws: string, id: string): Promise<AutomationDoc> {
    const a = await this.find(ws, id);
    if (!a) throw new ApiError('validation.not_found', `automation ${id} not found`);
    return a;
  }

  find(ws: string, id: string): Promise<AutomationDoc | null> {
    return this.docs.get<AutomationDoc>(tags.workspace(ws), id);
  }

  /** The Automation an ingest delivery names, wherever it lives; null when none. */
  async locate(id: string): Promise<AutomationDoc | null> {
    const ws = await this.redis.get(automationKeys.home(id));
    return ws ? this.docs.get<AutomationDoc>(tags.workspace(ws), id) : null;
  }

  /** Every change of an Automation: one that starts its schedule anew records when (`stampScheduleStart`). */
  update(ws: string, id: string, mutate: (a: AutomationDoc) => AutomationDoc | null, expectedVersion?: number): Promise<AutomationDoc> {
    return this.docs.update<AutomationDoc>(tags.workspace(ws), id, (cur) => {
      const next = mutate(cur);
      return next === null ? null : stampScheduleStart(cur, next, Date.now());
    }, { expectedVersion, notFound: `automation ${id}`, unchangedKeepsVersion: true });
  }

  /**
   * Deletes the Automation, with `expectedVersion` as one compare-and-delete: of two deletes one
   * answers and the other is 404, and a change that lands after the caller's read makes the
   * delete 409 `validation.conflict` instead of being erased unseen. Then its secret, home and metrics.
   */
  async remove(ws: string, id: string, expectedVersion?: number): Promise<void> {
    const r = await this.docs.removeIfVersion(tags.workspace(ws), id, expectedVersion, [AUTOMATIONS, SUBSCRIPTIONS]);
    if (r.kind === 'missing') throw new ApiError('validation.not_found', `automation ${id} not found`);
    if (r.kind === 'stale') {
      const at = (JSON.parse(r.current) as AutomationDoc).version;
      throw new ApiError('validation.conflict', `version ${expectedVersion ?? ''} ${staleOrAhead(expectedVersion, at)}; the current version is ${at}`);
    }
    await this.redis.del(automationKeys.secret(ws, id), automationKeys.home(id), automationKeys.metrics(ws, id));
  }

  /**
   * Whether the Workspace, or its Organization, is administratively disabled (or gone): then no
   * Automation of it fires, as no credential bound to it is admitted (docs/API.md).
   */
  async tenancyDisabled(ws: string): Promise<boolean> {
    const w = await this.docs.get<Workspace>(tags.workspace(ws), ws);
    if (!w || w.status === 'disabled') return true;
    const org = await this.docs.get<Organization>(tags.org(w.organization_id), w.organization_id);
    return !org || org.status === 'disabled';
  }

  // ---- signing secrets -----------------------------------------------------------------------

  private seal(id: string, secret: string): string {
    return this.box.seal(secret, `automation_secret:${id}`);
  }

  private async writeSecret(ws: string, id: string, r: SecretRecord): Promise<void> {
    await this.redis.set(automationKeys.secret(ws, id), JSON.stringify(r));
  }

  /** The secrets a delivery may be signed with right now: the current one, and the previous one during its overlap. */
  async verificationSecrets(ws: string, id: string, nowMs = Date.now()): Promise<string[]> {
    const raw = await this.redis.get(automationKeys.secret(ws, id));
    if (!raw) return [];
    const r = JSON.parse(raw) as SecretRecord;
    const out = [this.box.open(r.current, `automation_secret:${id}`)];
    if (r.previous && r.previous_expires_ms > nowMs) out.push(this.box.open(r.previous, `automation_secret:${id}`));
    return out;
  }

  /**
   * A new current secret of a webhook-triggered Automation at `expectedVersion` (returned once);
   * the old one keeps verifying until `overlapMs` from now. The secret and the document change
   * in one compare-and-swap (see `rotateSigningSecret`).
   */
  rotateSecret(ws: string, id: string, expectedVersion: number, overlapMs: number): Promise<{ doc: AutomationDoc; secret: string }> {
    return rotateSigningSecret<AutomationDoc>({
      redis: this.redis, docs: this.docs, tag: tags.workspace(ws), id, secretKey: automationKeys.secret(ws, id), seal: (secret) => this.seal(id, secret),
      expectedVersion, overlapMs, notFound: `automation ${id}`,
      apply: (a, r) => {
        if (a.trigger.type !== 'webhook' || !a.webhook) throw new ApiError('runtime.invalid_transition', 'only an Automation with a webhook trigger has a signing secret');
        return {
          ...a, webhook: { ...a.webhook, secret_generation: r.generation, previous_secret_expires_at: r.previousExpiresMs > 0 ? new Date(r.previousExpiresMs).toISOString() : null },
        };
      },
    });
  }

  // ---- firings -------------------------------------------------------------------------------

  /**
   * The durable receipt: the outbox entry first (so a crash after it is swept), then the
   * document. False when a receipt of that id exists already (it is left as it is).
   */
  async createFiring(f: FiringDoc): Promise<boolean> {
    await this.redis.zadd(automationKeys.outbox(), Date.now(), `${f.workspace_id}/${f.id}`);
    return this.docs.create(tags.workspace(f.workspace_id), f, [firingsOf(f.automation_id)]);
  }

  async firing(ws: string, id: string): Promise<FiringDoc> {
    const f = await this.docs.get<FiringDoc>(tags.workspace(ws), id);
    if (!f) throw new ApiError('validation.not_found', `automation firing ${id} not found`);
    return f;
  }

  updateFiring(ws: string, id: string, mutate: (f: FiringDoc) => FiringDoc | null, current?: FiringDoc): Promise<FiringDoc> {
    return this.docs.update<FiringDoc>(tags.workspace(ws), id, mutate, { notFound: `automation firing ${id}`, ...(current ? { current } : {}) });
  }

  async settled(f: FiringDoc): Promise<void> {
    await this.redis.zrem(automationKeys.outbox(), `${f.workspace_id}/${f.id}`);
  }

  /** Records a webhook delivery id; returns the firing an earlier delivery with that id made, if any. */
  async claimDelivery(ws: string, automationId: string, deliveryId: string, firingId: string): Promise<string | null> {
    const key = automationKeys.delivery(ws, automationId, deliveryId);
    const ok = await this.redis.set(key, firingId, 'EX', DELIVERY_ID_TTL_SECONDS, 'NX');
    return ok === 'OK' ? null : await this.redis.get(key);
  }

  async forgetDelivery(ws: string, automationId: string, deliveryId: string): Promise<void> {
    await this.redis.del(automationKeys.delivery(ws, automationId, deliveryId));
  }

  async admit(ws: string, automationId: string, firingId: string, max: number): Promise<boolean> {
    return (await ADMIT.run(this.redis, [automationKeys.running(ws, automationId)], [firingId, max])) === 1;
  }

  async release(ws: string, automationId: string, firingId: string): Promise<void> {
    await this.redis.srem(automationKeys.running(ws, automationId), firingId);
  }

  async count(ws: string, automationId: string, metric: 'fires' | 'admission_refusals' | 'failures' | 'skipped' | 'succeeded'): Promise<void> {
    await this.redis.hincrby(automationKeys.metrics(ws, automationId), metric, 1);
  }

  async metrics(ws: string, automationId: string): Promise<Record<string, number>> {
    const h = await this.redis.hgetall(automationKeys.metrics(ws, automationId));
    const n = (k: string) => Number(h[k] ?? 0);
    return { fires: n('fires'), admission_refusals: n('admission_refusals'), failures: n('failures'), skipped: n('skipped'), succeeded: n('succeeded') };
  }

  // ---- feedback ------------------------------------------------------------------------------

  /**
   * Writes the label unless its Principal already labelled the firing (one script with the
   * claim: see CREATE_FEEDBACK); 409 `validation.conflict` then.
   */
  async createFeedback(doc: FeedbackDoc): Promise<void> {
    const tag = tags.workspace(doc.workspace_id);
    const held = await CREATE_FEEDBACK.run(this.redis, [keys.unique(tag, feedbackOf(doc.firing_id)), keys.doc(tag, doc.id), keys.index(tag, feedbackOf(doc.firing_id))], [
      doc.authored_by, doc.id, JSON.stringify(doc), Date.parse(doc.created_at),
    ]);
    if (typeof held === 'string') throw new ApiError('validation.conflict', `Principal ${doc.authored_by} already labelled this firing; update that label instead`);
  }

  async feedbackCounts(ws: string, firingId: string): Promise<FeedbackDoc[]> {
    const all: FeedbackDoc[] = [];
    let page: string | undefined;
    for (;;) {
      const r = await this.docs.list<FeedbackDoc>(tags.workspace(ws), feedbackOf(firingId), { limit: 100, page, order: 'asc' });
      all.push(...r.data);
      if (!r.next_page) return all;
      page = r.next_page;
    }
  }
}
