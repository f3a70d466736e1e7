import { ApiError, type SecretBox, staleOrAhead } from '@agentplane/core';
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

/**
 * Starts a lane (HSETNX) only while the endpoint's document exists, and answers the lane's cursor
 * (nil without the endpoint): a step that ran on after a delete cannot leave a cursor behind.
 * KEYS: the endpoint's document, its cursors. ARGV: Session id, seq.
 */
const INIT_CURSOR = new LuaScript('webhook_cursor_init', `
if redis.call('EXISTS', KEYS[1]) == 0 then return false end
redis.call('HSETNX', KEYS[2], ARGV[1], ARGV[2])
return redis.call('HGET', KEYS[2], ARGV[1])`);

/**
 * Appends one delivery record only while the endpoint's document exists: a delivery that was in
 * flight when its endpoint was deleted leaves no log behind. KEYS: the document, the log. ARGV:
 * the log's cap, the record's JSON.
 */
const RECORD = new LuaScript('webhook_delivery_record', `
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[1], '*', 'r', ARGV[2])
return 1`);

export class WebhookStore {
  constructor(readonly redis: Redis, readonly docs: DocumentStore, private readonly box: SecretBox) {}

  /**
   * Writes a new endpoint, its first signing secret first; answers the secret. Every step may be
   * repeated: for an endpoint already written (a keyed create's retry) it writes a new first secret
   * and leaves the document as it is.
   */
  async create(e: EndpointDoc): Promise<string> {
    const secret = newSigningSecret();
    await this.redis.set(webhookKeys.secret(e.workspace_id, e.id), JSON.stringify({ generation: 1, current: this.seal(e.id, secret), previous: null, previous_expires_ms: 0 } satisfies SecretRecord));
    await this.redis.sadd(webhookKeys.workspaces(), e.workspace_id);
    await this.docs.create(tags.workspace(e.workspace_id), e, [ENDPOINTS]);
    return secret;
  }

  find(ws: string, id: string): Promise<EndpointDoc | null> {
    return this.docs.get<EndpointDoc>(tags.workspace(ws), id);
  }

  async get(ws: string, id: string): Promise<EndpointDoc> {
    const e = await this.find(ws, id);
    if (!e) throw new ApiError('validation.not_found', `webhook endpoint ${id} not found`);
    return e;
  }

  /** `unchangedKeepsVersion`: a change that leaves the endpoint as it is answers it as it is (no write, its version kept). */
  update(ws: string, id: string, mutate: (e: EndpointDoc) => EndpointDoc | null, expectedVersion?: number, unchangedKeepsVersion = false): Promise<EndpointDoc> {
    return this.docs.update<EndpointDoc>(tags.workspace(ws), id, mutate, { expectedVersion, notFound: `webhook endpoint ${id}`, unchangedKeepsVersion });
  }

  /**
   * Deletes the endpoint, with `expectedVersion` as one compare-and-delete: of two deletes one
   * answers and the other is 404, and an update that lands after the caller's read makes the
   * delete 409 `validation.conflict` instead of being erased unseen. Then its secret, cursors and log.
   */
  async remove(ws: string, id: string, expectedVersion?: number): Promise<void> {
    const r = await this.docs.removeIfVersion(tags.workspace(ws), id, expectedVersion, [ENDPOINTS]);
    if (r.kind === 'missing') throw new ApiError('validation.not_found', `webhook endpoint ${id} not found`);
    if (r.kind === 'stale') {
      const at = (JSON.parse(r.current) as EndpointDoc).version;
      throw new ApiError('validation.conflict', `version ${expectedVersion ?? ''} ${staleOrAhead(expectedVersion, at)}; the current version is ${at}`);
    }
    await this.redis.del(webhookKeys.secret(ws, id), webhookKeys.cursors(ws, id), webhookKeys.log(ws, id));
  }

  /** Every enabled endpoint of the Workspace (read 1,000 at a time: none past the first 1,000 is left out). */
  async enabled(ws: string): Promise<EndpointDoc[]> {
    const out: EndpointDoc[] = [];
    for (let from = 0; ; from += 1000) {
      const ids = await this.redis.zrange(keys.index(tags.workspace(ws), ENDPOINTS), from, from + 999);
      out.push(...(await this.docs.getMany<EndpointDoc>(tags.workspace(ws), ids)).filter((e) => e.status === 'enabled'));
      if (ids.length < 1000) return out;
    }
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

  /** A lane starts just before the first append the tap saw for it; null when the endpoint is gone. */
  async initCursor(ws: string, id: string, sessionId: string, seq: number): Promise<number | null> {
    const v = await INIT_CURSOR.run(this.redis, [keys.doc(tags.workspace(ws), id), webhookKeys.cursors(ws, id)], [sessionId, String(seq)]);
    return v === null || v === undefined ? null : Number(v);
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

  /** One record in the endpoint's delivery log; none once the endpoint is deleted. */
  async record(ws: string, endpointId: string, r: Omit<DeliveryRecord, 'at'>): Promise<void> {
    await RECORD.run(this.redis, [keys.doc(tags.workspace(ws), endpointId), webhookKeys.log(ws, endpointId)], [
      String(DELIVERY_LOG_MAX), JSON.stringify({ ...r, at: new Date().toISOString() }),
    ]);
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
