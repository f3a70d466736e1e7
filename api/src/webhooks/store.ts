import { ApiError, type SecretBox } from '@agentplane/core';
import { keys, LuaScript, tags, type DocumentStore, type Redis } from '@agentplane/store';
import { newSigningSecret, rotateSigningSecret, type SecretRecord } from '../automations/signing-secret.js';
import { ENDPOINTS, type DeliveryRecord, type EndpointDoc } from './model.js';

/** How many delivery records each endpoint keeps (oldest dropped first). */
export const DELIVERY_LOG_MAX = 1000;

export const webhookKeys = {
  secret: (ws: string, id: string) => keys.scoped(tags.workspace(ws), `webhook_secret:${id}`),
  /** Per endpoint: Session id → the last seq delivered (or skipped by the filter). */
  cursors: (ws: string, id: string) => keys.scoped(tags.workspace(ws), `webhook_cursor:${id}`),
  log: (ws: string, id: string) => keys.scoped(tags.workspace(ws), `webhook_log:${id}`),
  /** Workspaces that have (or had) endpoints: the event tap and the sweep look only at these. */
  workspaces: () => keys.global('webhook_workspaces'),
};

/** Moves a lane's cursor only from the value the caller read (a stale lane job changes nothing). */
const ADVANCE = new LuaScript('webhook_cursor_advance', `
local cur = redis.call('HGET', KEYS[1], ARGV[1])
if (cur or '') ~= ARGV[2] then return 0 end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[3])
return 1`);

export class WebhookStore {
  constructor(readonly redis: Redis, readonly docs: DocumentStore, private readonly box: SecretBox) {}

  async create(e: EndpointDoc): Promise<string> {
    const secret = newSigningSecret();
    await this.redis.set(webhookKeys.secret(e.workspace_id, e.id), JSON.stringify({ generation: 1, current: this.seal(e.id, secret), previous: null, previous_expires_ms: 0 } satisfies SecretRecord));
    await this.redis.sadd(webhookKeys.workspaces(), e.workspace_id);
    await this.docs.create(tags.workspace(e.workspace_id), e, [ENDPOINTS]);
    return secret;
  }

  async get(ws: string, id: string): Promise<EndpointDoc> {
    const e = await this.docs.get<EndpointDoc>(tags.workspace(ws), id);
    if (!e) throw new ApiError('validation.not_found', `webhook endpoint ${id} not found`);
    return e;
  }

  update(ws: string, id: string, mutate: (e: EndpointDoc) => EndpointDoc | null, expectedVersion?: number): Promise<EndpointDoc> {
    return this.docs.update<EndpointDoc>(tags.workspace(ws), id, mutate, { expectedVersion, notFound: `webhook endpoint ${id}` });
  }

  async remove(ws: string, id: string): Promise<void> {
    await this.docs.remove(tags.workspace(ws), id, [ENDPOINTS]);
    await this.redis.del(webhookKeys.secret(ws, id), webhookKeys.cursors(ws, id), webhookKeys.log(ws, id));
  }

  async enabled(ws: string): Promise<EndpointDoc[]> {
    const ids = await this.redis.zrange(keys.index(tags.workspace(ws), ENDPOINTS), 0, 999);
    return (await this.docs.getMany<EndpointDoc>(tags.workspace(ws), ids)).filter((e) => e.status === 'enabled');
  }

  private seal(id: string, secret: string): string {
    return this.box.seal(secret, `webhook_secret:${id}`);
  }

  /** The secrets to sign with now: the current one, and the previous one during its overlap. */
  async signingSecrets(ws: string, id: string, nowMs = Date.now()): Promise<string[]> {
    const raw = await this.redis.get(webhookKeys.secret(ws, id));
    if (!raw) return [];
    const r = JSON.parse(raw) as SecretRecord;
    const out = [this.box.open(r.current, `webhook_secret:${id}`)];
    if (r.previous && r.previous_expires_ms > nowMs) out.push(this.box.open(r.previous, `webhook_secret:${id}`));
    return out;
  }

  /**
   * A new signing secret of the endpoint at `expectedVersion` (returned once); deliveries carry
   * both signatures for `overlapMs`. The secret and the document change in one compare-and-swap
   * (see `rotateSigningSecret`).
   */
  rotateSecret(ws: string, id: string, expectedVersion: number, overlapMs: number): Promise<{ doc: EndpointDoc; secret: string }> {
    return rotateSigningSecret<EndpointDoc>({
      redis: this.redis, docs: this.docs, tag: tags.workspace(ws), id, secretKey: webhookKeys.secret(ws, id), seal: (secret) => this.seal(id, secret),
      expectedVersion, overlapMs, notFound: `webhook endpoint ${id}`,
      apply: (e, r) => ({ ...e, secret_generation: r.generation, previous_secret_expires_at: r.previousExpiresMs > 0 ? new Date(r.previousExpiresMs).toISOString() : null }),
    });
  }

  // ---- lanes (endpoint × Session) --------------------------------------------------------------

  async cursor(ws: string, id: string, sessionId: string): Promise<number | null> {
    const v = await this.redis.hget(webhookKeys.cursors(ws, id), sessionId);
    return v === null ? null : Number(v);
  }

  /** A lane starts just before the first append the tap saw for it. */
  async initCursor(ws: string, id: string, sessionId: string, seq: number): Promise<number> {
    await this.redis.hsetnx(webhookKeys.cursors(ws, id), sessionId, String(seq));
    return Number(await this.redis.hget(webhookKeys.cursors(ws, id), sessionId));
  }

  async advance(ws: string, id: string, sessionId: string, from: number, to: number): Promise<boolean> {
    return (await ADVANCE.run(this.redis, [webhookKeys.cursors(ws, id)], [sessionId, String(from), String(to)])) === 1;
  }

  /** An erased Session's lane is over. */
  async dropLane(ws: string, id: string, sessionId: string): Promise<void> {
    await this.redis.hdel(webhookKeys.cursors(ws, id), sessionId);
  }

  async lanes(ws: string, id: string): Promise<Record<string, string>> {
    return this.redis.hgetall(webhookKeys.cursors(ws, id));
  }

  // ---- delivery log -----------------------------------------------------------------------------

  async record(ws: string, endpointId: string, r: Omit<DeliveryRecord, 'at'>): Promise<void> {
    await this.redis.xadd(webhookKeys.log(ws, endpointId), 'MAXLEN', '~', String(DELIVERY_LOG_MAX), '*', 'r', JSON.stringify({ ...r, at: new Date().toISOString() }));
  }

  /** Newest first. The cursor is the last entry's stream id, written `c1_<ms>s<n>`. */
  async deliveries(ws: string, endpointId: string, limit: number, page?: string): Promise<{ data: DeliveryRecord[]; next_page: string | null }> {
    let end = '+';
    if (page) {
      const before = parseDeliveryCursor(page);
      // Nothing comes before the first possible id.
      if (before === 'start') return { data: [], next_page: null };
      end = `(${before}`;
    }
    const rows = (await this.redis.xrevrange(webhookKeys.log(ws, endpointId), end, '-', 'COUNT', limit + 1)) as [string, string[]][];
    const data = rows.slice(0, limit).map(([, fields]) => {
      const r = JSON.parse(fields[1] ?? '{}') as DeliveryRecord;
      // A record written before `retry_after_ms` was recorded reads it as null.
      return { ...r, retry_after_ms: r.retry_after_ms ?? null };
    });
    const last = rows[limit - 1];
    return { data, next_page: rows.length > limit && last ? `c1_${last[0].replace('-', 's')}` : null };
  }
}

/**
 * A delivery log cursor (`c1_<ms>s<n>`) as the stream id it names (`<ms>-<n>`), or `start` for
 * `0-0`, before which there is nothing. Both parts must be safe integers (a stream id's parts are
 * unsigned 64-bit; the log's are milliseconds and small sequence numbers): anything else was not
 * issued by this list, 400 `validation.malformed`.
 */
export function parseDeliveryCursor(page: string): string {
  const m = /^c1_(\d{1,16})s(\d{1,16})$/.exec(page);
  const ms = m ? Number(m[1]) : NaN;
  const seq = m ? Number(m[2]) : NaN;
  if (!Number.isSafeInteger(ms) || !Number.isSafeInteger(seq)) throw new ApiError('validation.malformed', 'query.page: not a cursor issued by this list');
  return ms === 0 && seq === 0 ? 'start' : `${ms}-${seq}`;
}
