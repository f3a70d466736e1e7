import type { Redis } from 'ioredis';
import { ATTR, envInt, inSpan, newId, SpanKind, tracingEnabled, type Attributes, type Context, type Env } from '@agentplane/core';
import { keys, tags } from './keys.js';
import { isNoScript, LuaScript } from './script.js';
import { Joiner } from './joiner.js';

/**
 * The durable, append-only, totally ordered event log of one Session.
 *
 * Layout (every key in the `{s:<sess>}` slot, so each script is Redis Cluster-safe):
 *
 *   ap:{s:<sess>}:events     stream; entry id `<seq>-0`, one field `e` = the event JSON
 *   ap:{s:<sess>}:log        hash: `seq` (last assigned), `low` (first readable seq after
 *                            retention), `erased` (ms, set by erase), `last_event_ms`
 *   ap:{s:<sess>}:producers  hash: producer key -> seq it was assigned
 *   ap:{s:<sess>}:producers:ts  zset: producer key -> ms it was recorded (pruning)
 *   ap:{s:<sess>}:stats      hash of integer counters kept current by the append script
 *   ap:{s:<sess>}:lease      hash of the live leases of this Session's threads (written by the
 *                            lease keeper): `t:<token>` = expires_at_ms, one per leased Run
 *                            (threads of a coordinator Session run in parallel), `r:<run>` =
 *                            the Run's current token, `i:<token>` = runner|attempt|run
 *
 * Channels: `ap:{s:<sess>}:live` carries every committed append (see LiveMessage);
 * `ap:{s:<sess>}:deltas` carries uncursored previews (see DeltaMessage).
 *
 * The stream is never trimmed by MAXLEN. Retention is explicit (`trimThrough`) and moves the
 * `low` mark, so readers report the unreadable range as a gap, never silently skip it.
 */

/** How long a producer key is remembered: a retry within this window never duplicates. */
export const PRODUCER_KEY_TTL_MS = 7 * 24 * 3600 * 1000;
/**
 * How long an event appended without a producer key is known by its id (`id:<evt id>` in the
 * producer keys): a Redis client sends a command again on its new connection when the old one
 * dropped before the answer came (ioredis does so by default), and a script that had run would
 * otherwise append its events twice. A resend comes within seconds of the reconnect, or never.
 */
export const RESEND_GUARD_MS = 10 * 60 * 1000;
/** Live messages carry the events inline up to this many bytes; past it, only the range. */
export const LIVE_INLINE_MAX_BYTES = 64 * 1024;
/** Most events one append call may carry. */
export const MAX_APPEND_BATCH = 500;

export interface LogEvent {
  id: string;
  seq: number;
  created_at: string;
  session_id: string;
  session_thread_id: string | null;
  type: string;
  payload: unknown;
}

export interface AppendEvent {
  type: string;
  payload: unknown;
  session_thread_id?: string | null;
  /** Retrying an append with the same producer key returns the originally assigned event. */
  producer_key?: string;
  /** The event's id when the caller names it ahead (`newEventId()`), e.g. to refer to it in a document of the same commit. */
  id?: string;
  /**
   * Integer counters added to the stats hash in the same script (e.g. `usage.input_tokens`).
   * Every event also counts `events` and `events.<type>`, for the session and its thread.
   */
  counters?: Record<string, number>;
}

export interface AppendOptions {
  /** Lease token of the Run writing these events; a stale or expired token is rejected. */
  fence?: string;
  /** Batch producer key: event i gets `<producerKey>#<i>` unless it carries its own key. */
  producerKey?: string;
  /**
   * Queue the appended events in the same script: the id of every event this call appended
   * (not the replays of earlier appends) is pushed onto the list `list`, and the JSON of the
   * document at `peek` is returned as read right after (`peeked`), with the list as it is then
   * (`queued`, when it holds at most `QUEUE_HEAD` ids). Both keys are in the Session's
   * slot. The drive path queues a `user.message` for its thread's next turn this way: no
   * compare-and-swap on the thread, so messages into one busy thread never contend.
   *
   * With `refuseStatus`, the same script first checks the `peek` document: nothing is appended
   * when it is absent (`refused`, `absent`) or its `status` is `refuseStatus` (`refused`,
   * `status`). The drive path sends a message without reading its thread first this way. The
   * document is looked at as `JSON.stringify` writes it (`"status":"<value>"`, no spaces).
   */
  enqueue?: { list: string; peek: string; refuseStatus?: string };
  /** The trace context the append is made in (its span's parent): docs/ARCHITECTURE.md, tracing. */
  trace?: Context | undefined;
}

export type AppendResult =
  | {
    ok: true; events: LogEvent[]; /** per event: true when it was a replay of an earlier append */ duplicate: boolean[]; last_seq: number;
    /** With `enqueue`: the `peek` document's JSON (null when absent). */
    peeked?: string | null;
    /** With `enqueue`: the list's ids right after this append, when it holds at most `QUEUE_HEAD` (else absent). */
    queued?: string[];
    /** With the commit's `reads`: each value as the script read it after the write (null when absent). */
    read?: (string | null)[];
  }
  | { ok: false; reason: 'erased' }
  | { ok: false; reason: 'fenced'; detail: 'mismatch' | 'expired' }
  /** With `enqueue.refuseStatus`: the peeked document is absent, or its status is the refused one. */
  | { ok: false; reason: 'refused'; detail: 'absent' | 'status' };

/** A document written by \`EventLog.commit\` (its key and any index key in the Session's slot). */
export interface CommitDoc {
  key: string;
  /** The document's JSON. */
  body: string;
  /** Compare-and-swap: the stored document's \`version\` must be this; null: it must not exist yet. */
  expectedVersion: number | null;
  /** A sorted-set index to add the document to. */
  index?: { key: string; score: number; member: string };
}

export interface CommitOptions extends Pick<AppendOptions, 'fence' | 'producerKey' | 'trace'> {
  /** Take these ids off the head of a list in the same script (a turn consuming its queued inputs). */
  dequeue?: CommitDequeue;
  /** Instead of `dequeue`: this list (in the Session's slot) must be empty, or nothing is written (`queue`). */
  emptyList?: string;
  /** Nothing is written (`replay`) when an event's producer key names an earlier append. */
  fresh?: boolean;
  /**
   * A list in the Session's slot (a thread's input queue) read by the same script once the
   * commit is written: the result's \`queued\` holds it when it has at most \`QUEUE_HEAD\` ids
   * (a longer one is the caller's to read).
   */
  peekList?: string;
  /**
   * Keys in the Session's slot read by the same script once the commit is written (a GET, or an
   * HGET of `field`): the result's `read`, in this order. What the caller would read next, without
   * a round trip of its own (a turn's end reads the thread's active outcome).
   */
  reads?: readonly CommitRead[];
  /**
   * Called once the commit's command is issued on the connection, before it is answered: what
   * it sends on the same connection goes out behind the commit, and a single Redis runs it after
   * the commit. With it, a commit whose script the server does not hold is not sent again
   * (`unloaded`): what went behind it ran first.
   */
  behind?: () => void;
  /**
   * A hash field (in the Session's slot) the commit takes: nothing is written (`claimed`, with
   * the current holder) when the field holds a value other than `replaces`; else it is set to
   * `value` with the documents and events. Absent `replaces`: the field must be absent. One
   * script, so of two commits claiming the same field, one only is written (a thread's outcome
   * under way: docs/OUTCOMES.md). Checked after `fresh`: a replay is answered as such.
   */
  claim?: CommitClaim;
  /**
   * The event's sequence number written into a document of the same commit: document `doc`
   * (0-based) holds `SEQ_PLACEHOLDER` as the value of `field` (a top-level or nested key, the
   * first occurrence), replaced by the seq the event gets. Needs `fresh` and one event (so the
   * seq is the next one). A document that refers to its own event by seq (a wait's answer) is
   * then written with it in one script, where it would otherwise need a write after the append.
   */
  seqInto?: { doc: number; field: string };
}

/** What a document committed with `seqInto` holds in place of its event's seq (a number no seq is). */
export const SEQ_PLACEHOLDER = Number.MIN_SAFE_INTEGER;

/** Commit option: take the field `field` of the hash `key` for `value` (see `CommitOptions.claim`). */
export interface CommitClaim {
  key: string;
  field: string;
  value: string;
  /** The holder the claim may replace (one known to be over); absent: the field must be free. */
  replaces?: string | null;
}

/** One value a commit reads after its write: the string at `key`, or `field` of the hash at `key`. */
export interface CommitRead {
  key: string;
  field?: string;
}

export type CommitResult =
  | AppendResult
  /** Nothing was written: document \`index\` (0-based) failed its check; \`current\` is its JSON when stale. */
  | { ok: false; reason: 'stale'; index: number; current: string }
  | { ok: false; reason: 'missing' | 'exists'; index: number }
  /** Nothing was written: the `dequeue` list no longer starts with the expected ids (or, with `emptyList`, is not empty). */
  | { ok: false; reason: 'queue' }
  /** Nothing was written (`fresh`): an event's producer key names an earlier append. */
  | { ok: false; reason: 'replay' }
  /** Nothing was written (`claim`): the hash field is held by `holder`. */
  | { ok: false; reason: 'claimed'; holder: string }
  /** Nothing was written (`behind`): the server did not hold the script (a restart, SCRIPT FLUSH). */
  | { ok: false; reason: 'unloaded' };

/** Commit option: remove these ids from the head of `list` (they must be its first entries). */
export interface CommitDequeue {
  list: string;
  ids: readonly string[];
}

export interface LogState {
  /** Last assigned sequence number (0 when empty). */
  seq: number;
  /** First readable sequence number (1 unless retention trimmed the head). */
  low: number;
  erased: boolean;
}

/** Published on `ap:{s:<sess>}:live` after every append that added events, and on erase. */
export type LiveMessage =
  | { kind: 'events'; from: number; to: number; events?: LogEvent[] }
  | { kind: 'erased'; through: number };

/** Uncursored preview fragment published on `ap:{s:<sess>}:deltas` by the runner side. */
export interface DeltaMessage {
  session_thread_id: string | null;
  /** `agent.message` or `agent.thinking`. */
  type: 'agent.message' | 'agent.thinking';
  /** Stable id of the message being previewed (the final event may carry it as `payload.message_id`). */
  message_id: string;
  /** Order of this fragment within the message. */
  index: number;
  text: string;
}

export const eventLogKeys = {
  stream: (sessionId: string) => keys.scoped(tags.session(sessionId), 'events'),
  meta: (sessionId: string) => keys.scoped(tags.session(sessionId), 'log'),
  producers: (sessionId: string) => keys.scoped(tags.session(sessionId), 'producers'),
  producersTs: (sessionId: string) => keys.scoped(tags.session(sessionId), 'producers:ts'),
  stats: (sessionId: string) => keys.scoped(tags.session(sessionId), 'stats'),
  lease: (sessionId: string) => keys.scoped(tags.session(sessionId), 'lease'),
  liveChannel: (sessionId: string) => keys.scoped(tags.session(sessionId), 'live'),
  deltaChannel: (sessionId: string) => keys.scoped(tags.session(sessionId), 'deltas'),
};

/** Lua `iso(ms)`: epoch milliseconds to RFC 3339 UTC with milliseconds (days-from-civil inverse). */
export const ISO_LUA = `
local function iso(ms)
  local secs = math.floor(ms / 1000)
  local days = math.floor(secs / 86400)
  local rem = secs - days * 86400
  local z = days + 719468
  local era = math.floor(z / 146097)
  local doe = z - era * 146097
  local yoe = math.floor((doe - math.floor(doe / 1460) + math.floor(doe / 36524) - math.floor(doe / 146096)) / 365)
  local y = yoe + era * 400
  local doy = doe - (365 * yoe + math.floor(yoe / 4) - math.floor(yoe / 100))
  local mp = math.floor((5 * doy + 2) / 153)
  local d = doy - math.floor((153 * mp + 2) / 5) + 1
  local m = mp + 3
  if mp >= 10 then m = mp - 9 end
  if m <= 2 then y = y + 1 end
  return string.format('%04d-%02d-%02dT%02d:%02d:%02d.%03dZ', y, m, d, math.floor(rem / 3600),
    math.floor((rem % 3600) / 60), rem % 60, ms % 1000)
end`;

/*
 * Lua \`append(KEYS, ARGV)\`, shared by the append and commit scripts.
 * KEYS: stream, meta, producers, producers:ts, lease, stats
 * ARGV: fence | producer ttl ms | live channel | n | inline max | then per event:
 *       producer key | event id | JSON tail (after the opening brace) | counters "f=n;f=n"
 */
const APPEND_LUA = `${ISO_LUA}
local function fenced(KEYS, ARGV, now_ms)
  if ARGV[1] == '' then return nil end
  local exp = redis.call('HGET', KEYS[5], 't:' .. ARGV[1])
  if not exp then return {'fenced', 'mismatch'} end
  if tonumber(exp) <= now_ms then return {'fenced', 'expired'} end
  return nil
end
local function append(KEYS, ARGV, erased_checked)
local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if not erased_checked and redis.call('HEXISTS', KEYS[2], 'erased') == 1 then return {'erased'} end
local refused = fenced(KEYS, ARGV, now_ms)
if refused then return refused end
local created = iso(now_ms)
local seq = tonumber(redis.call('HGET', KEYS[2], 'seq') or '0')
local ttl = tonumber(ARGV[2])
local n = tonumber(ARGV[4])
local out = {'ok', ''}
local fresh = {}
local first = nil
local size = 0
for i = 0, n - 1 do
  local b = 6 + i * 4
  local pk = ARGV[b]
  -- No producer key: the event's id stands for one, for a short while (RESEND_GUARD_MS), and is
  -- recorded as if from that long ago, so the prune below drops it once that while is over.
  local since = now_ms
  if pk == '' then
    pk = 'id:' .. ARGV[b + 1]
    since = now_ms - ttl + ${RESEND_GUARD_MS}
  end
  local existing = redis.call('HGET', KEYS[3], pk)
  if existing then
    local rows = redis.call('XRANGE', KEYS[1], existing .. '-0', existing .. '-0')
    local body = ''
    if rows[1] then body = rows[1][2][2] end
    out[#out + 1] = body
    out[#out + 1] = 'dup'
  else
    seq = seq + 1
    local body = '{"id":"' .. ARGV[b + 1] .. '","seq":' .. seq .. ',"created_at":"' .. created .. '",' .. ARGV[b + 2]
    redis.call('XADD', KEYS[1], seq .. '-0', 'e', body)
    redis.call('HSET', KEYS[3], pk, seq)
    redis.call('ZADD', KEYS[4], since, pk)
    for f, v in string.gmatch(ARGV[b + 3], '([^=;]+)=(-?%d+)') do redis.call('HINCRBY', KEYS[6], f, v) end
    fresh[#fresh + 1] = body
    size = size + #body
    if not first then first = seq end
    out[#out + 1] = body
    out[#out + 1] = 'new'
  end
end
out[2] = tostring(seq)
if first then
  redis.call('HSET', KEYS[2], 'seq', seq, 'last_event_ms', now_ms)
  redis.call('HSET', KEYS[6], 'last_event_at', created)
  local msg
  if size <= tonumber(ARGV[5]) then
    msg = '{"kind":"events","from":' .. first .. ',"to":' .. seq .. ',"events":[' .. table.concat(fresh, ',') .. ']}'
  else
    msg = '{"kind":"events","from":' .. first .. ',"to":' .. seq .. '}'
  end
  redis.call('PUBLISH', ARGV[3], msg)
end
local old = redis.call('ZRANGEBYSCORE', KEYS[4], '-inf', now_ms - ttl, 'LIMIT', 0, 64)
if #old > 0 then
  redis.call('HDEL', KEYS[3], unpack(old))
  redis.call('ZREM', KEYS[4], unpack(old))
end
return out
end`;

/**
 * A new event id (`evt_` and 32 hex digits), as the log assigns them: from the id pool, not a
 * CSPRNG call of its own (one per appended event was 2–3% of a busy API's CPU).
 */
export const newEventId = (): string => newId('event');

/** The most queued ids an append with `enqueue` returns (a longer queue is read by the caller). */
export const QUEUE_HEAD = 32;

/*
 * KEYS 7 and 8 (optional): the enqueue list and the peeked document (AppendOptions.enqueue);
 * then ARGV's last (after the events) is the refused status ('' for none): an absent peeked
 * document, or one with that status, refuses the append before anything is written.
 * Then the peeked document and the list's length, and the list itself when it is short.
 */
const APPEND = new LuaScript('event_log_append', `${APPEND_LUA}
-- The peeked document as read for the refusal (the append does not write it), and whether the
-- erased mark was checked there.
local doc = nil
local erased_checked = false
if KEYS[8] then
  local refuse = ARGV[6 + tonumber(ARGV[4]) * 4]
  if refuse and refuse ~= '' then
    if redis.call('HEXISTS', KEYS[2], 'erased') == 1 then return {'erased'} end
    erased_checked = true
    doc = redis.call('GET', KEYS[8])
    if not doc then return {'refused', 'absent'} end
    -- Decoded only when the status's text appears at all (a thread's document holds its Agent:
    -- often kilobytes, and a plain search costs far less than a decode).
    if string.find(doc, '"status":' .. cjson.encode(refuse), 1, true) then
      local ok, d = pcall(cjson.decode, doc)
      if ok and type(d) == 'table' and d['status'] == refuse then return {'refused', 'status'} end
    end
  end
end
local out = append(KEYS, ARGV, erased_checked)
if KEYS[7] and out[1] == 'ok' then
  local len = 0
  for i = 3, #out - 1, 2 do
    if out[i + 1] == 'new' then len = redis.call('RPUSH', KEYS[7], string.match(out[i], '^{"id":"([^"]+)"')) end
  end
  if len == 0 then len = redis.call('LLEN', KEYS[7]) end
  out[#out + 1] = doc or redis.call('GET', KEYS[8]) or ''
  out[#out + 1] = tostring(len)
  if len <= ${QUEUE_HEAD} then
    for _, id in ipairs(redis.call('LRANGE', KEYS[7], 0, -1)) do out[#out + 1] = id end
  end
end
return out`);

/*
 * Document writes and an append in one script, all or nothing: the lease fence (when one is
 * given) and every document are checked first (compare-and-swap on \`version\`, or must not exist
 * yet), then the documents are written, then the events are appended exactly as by APPEND
 * (which no longer refuses once those checks passed).
 * KEYS: the six log keys, then per document its key and, if indexed, its index key, then the
 *       dequeue list when k > 0
 * ARGV: as APPEND, then m | per document: expected version ('' = new) | JSON | indexed '1'/'0' |
 *       score | member, then k | the k ids the dequeue list must start with (removed from it)
 *       (k = -1: the list must be empty) | fresh ('1': no event's producer key may be known) |
 *       peek ('1': the key after those is a list returned after the append, as APPEND's enqueue
 *       does: '' (no document), its length and, when short, its ids) | r | the r reads' hash fields
 *       ('' = GET), their keys after the peeked list in KEYS; the r values read (false when
 *       absent) follow the events in the reply, before the peek's | claim ('1': the hash field
 *       field | value | the holder it may replace ('' = none) is taken, the hash's key last in
 *       KEYS; a field held by another holder refuses the commit: {'claimed', holder})
 */
const COMMIT = new LuaScript(
  'event_log_commit',
  `${APPEND_LUA}
if redis.call('HEXISTS', KEYS[2], 'erased') == 1 then return {'erased'} end
if ARGV[1] ~= '' then
  local t = redis.call('TIME')
  local refused = fenced(KEYS, ARGV, tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000))
  if refused then return refused end
end
local a = 6 + tonumber(ARGV[4]) * 4
local m = tonumber(ARGV[a])
local ki = 7
local docs = {}
for i = 1, m do
  local b = a + 1 + (i - 1) * 5
  local d = {key = KEYS[ki], expected = ARGV[b], body = ARGV[b + 1]}
  ki = ki + 1
  if ARGV[b + 2] == '1' then
    d.index = KEYS[ki]
    d.score = ARGV[b + 3]
    d.member = ARGV[b + 4]
    ki = ki + 1
  end
  local cur = redis.call('GET', d.key)
  if d.expected == '' then
    if cur then return {'exists', tostring(i)} end
  else
    if not cur then return {'missing', tostring(i)} end
    if tostring(cjson.decode(cur)['version']) ~= d.expected then return {'stale', tostring(i), cur} end
  end
  docs[i] = d
end
local q = a + 1 + m * 5
local k = tonumber(ARGV[q] or '0')
if k > 0 then
  local have = redis.call('LRANGE', KEYS[ki], 0, k - 1)
  if #have ~= k then return {'queue'} end
  for j = 1, k do
    if have[j] ~= ARGV[q + j] then return {'queue'} end
  end
elseif k < 0 then
  if redis.call('LLEN', KEYS[ki]) > 0 then return {'queue'} end
end
if ARGV[q + math.max(k, 0) + 1] == '1' then
  for i = 0, tonumber(ARGV[4]) - 1 do
    local pk = ARGV[6 + i * 4]
    if pk ~= '' and redis.call('HEXISTS', KEYS[3], pk) == 1 then return {'replay'} end
  end
end
local pf = q + math.max(k, 0) + 2
-- The keys after the documents: the dequeue (or empty) list when k ~= 0, the peeked list when
-- peek is '1', then the reads' keys, then the claim's hash.
local pk = ki
if k ~= 0 then pk = ki + 1 end
local peek = KEYS[pk]
local rk = pk
if ARGV[pf] == '1' then rk = pk + 1 end
local nr = tonumber(ARGV[pf + 1] or '0')
local cf = pf + 2 + nr
local claim = nil
local sf = cf + 1
if ARGV[cf] == '1' then
  claim = {key = KEYS[rk + nr], field = ARGV[cf + 1], value = ARGV[cf + 2]}
  local held = redis.call('HGET', claim.key, claim.field)
  if held and held ~= ARGV[cf + 3] then return {'claimed', held} end
  sf = cf + 4
end
-- seqInto: the first new event's sequence number written into a document, in place of the
-- placeholder its field holds (as JSON.stringify writes it: the key in quotes, no space).
if ARGV[sf] and ARGV[sf] ~= '' then
  local d = docs[tonumber(ARGV[sf])]
  local token = '"' .. ARGV[sf + 1] .. '":${SEQ_PLACEHOLDER}'
  local s, e = string.find(d.body, token, 1, true)
  if not s then return redis.error_reply('seqInto: the document has no placeholder') end
  local nxt = tonumber(redis.call('HGET', KEYS[2], 'seq') or '0') + 1
  d.body = string.sub(d.body, 1, s - 1) .. '"' .. ARGV[sf + 1] .. '":' .. nxt .. string.sub(d.body, e + 1)
end
for i = 1, m do
  local d = docs[i]
  if d.expected == '' then redis.call('SET', d.key, d.body) else redis.call('SET', d.key, d.body, 'KEEPTTL') end
  if d.index then redis.call('ZADD', d.index, d.score, d.member) end
end
if k > 0 then redis.call('LTRIM', KEYS[ki], k, -1) end
if claim then redis.call('HSET', claim.key, claim.field, claim.value) end
local out = append(KEYS, ARGV)
if nr > 0 and out[1] == 'ok' then
  for i = 1, nr do
    local field = ARGV[pf + 1 + i]
    if field == '' then out[#out + 1] = redis.call('GET', KEYS[rk + i - 1]) else out[#out + 1] = redis.call('HGET', KEYS[rk + i - 1], field) end
  end
end
if ARGV[pf] == '1' and out[1] == 'ok' then
  local len = redis.call('LLEN', peek)
  out[#out + 1] = ''
  out[#out + 1] = tostring(len)
  if len <= ${QUEUE_HEAD} then
    for _, id in ipairs(redis.call('LRANGE', peek, 0, -1)) do out[#out + 1] = id end
  end
end
return out`,
);

/* KEYS: stream, meta, producers, producers:ts, stats, lease. ARGV: live channel. */
const ERASE = new LuaScript(
  'event_log_erase',
  `
local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local seq = redis.call('HGET', KEYS[2], 'seq') or '0'
redis.call('DEL', KEYS[1], KEYS[3], KEYS[4], KEYS[5], KEYS[6])
if redis.call('HEXISTS', KEYS[2], 'erased') == 0 then redis.call('HSET', KEYS[2], 'erased', now_ms) end
redis.call('HSET', KEYS[2], 'seq', seq, 'low', tonumber(seq) + 1)
redis.call('PUBLISH', ARGV[1], '{"kind":"erased","through":' .. seq .. '}')
return tonumber(seq)`,
);

/* KEYS: stream, meta. ARGV: through seq. Retention: drop entries <= through, move `low`. */
const TRIM = new LuaScript(
  'event_log_trim',
  `
local low = tonumber(redis.call('HGET', KEYS[2], 'low') or '1')
local want = tonumber(ARGV[1]) + 1
if want <= low then return low end
redis.call('XTRIM', KEYS[1], 'MINID', want .. '-0')
redis.call('HSET', KEYS[2], 'low', want)
return want`,
);

/**
 * An event's counters: the Session's events, in all and by type, and what the event adds
 * (usage), for the Session and for its thread. (Events are not counted per thread: nothing
 * reads such counts, and each was two more writes per event in the append script.)
 */
function encodeCounters(ev: AppendEvent): string {
  const threadId = ev.session_thread_id ?? null;
  // The counters travel as `name=value;…`: a type or name holding either separator would write
  // another counter (or a field that is not one, failing the script after its first write).
  const parts = /[=;]/.test(ev.type) ? ['s.events=1'] : ['s.events=1', `s.events.${ev.type}=1`];
  for (const [name, value] of Object.entries(ev.counters ?? {})) {
    if (!Number.isInteger(value) || value === 0 || /[=;]/.test(name)) continue;
    parts.push(`s.${name}=${value}`);
    if (threadId) parts.push(`t.${threadId}.${name}=${value}`);
  }
  return parts.join(';');
}

function parseEntries(rows: [string, string[]][]): LogEvent[] {
  const out: LogEvent[] = [];
  for (const [, fields] of rows) {
    const i = fields.indexOf('e');
    const body = i >= 0 ? fields[i + 1] : undefined;
    if (body !== undefined) out.push(JSON.parse(body) as LogEvent);
  }
  return out;
}

function logKeys(sessionId: string): string[] {
  const k = eventLogKeys;
  return [k.stream(sessionId), k.meta(sessionId), k.producers(sessionId), k.producersTs(sessionId), k.lease(sessionId), k.stats(sessionId)];
}

function appendArgs(sessionId: string, events: readonly AppendEvent[], options: AppendOptions): (string | number)[] {
  if (events.length > MAX_APPEND_BATCH) throw new RangeError(`at most ${MAX_APPEND_BATCH} events per append`);
  return [...appendHead(sessionId, events.length, options.fence), ...eventArgs(sessionId, events, options.producerKey)];
}

/** The arguments before the events': fence, producer-key TTL, live channel, count, inline maximum. */
function appendHead(sessionId: string, count: number, fence: string | undefined): (string | number)[] {
  return [fence ?? '', PRODUCER_KEY_TTL_MS, eventLogKeys.liveChannel(sessionId), count, LIVE_INLINE_MAX_BYTES];
}

/** Four arguments per event: producer key, event id, JSON tail (after the opening brace), counters. */
function eventArgs(sessionId: string, events: readonly AppendEvent[], producerKey: string | undefined): string[] {
  const args: string[] = [];
  events.forEach((ev, i) => {
    const pk = ev.producer_key ?? (producerKey !== undefined ? `${producerKey}#${i}` : '');
    const tail = JSON.stringify({
      session_id: sessionId,
      session_thread_id: ev.session_thread_id ?? null,
      type: ev.type,
      payload: ev.payload ?? {},
    }).slice(1);
    args.push(pk, ev.id ?? newEventId(), tail, encodeCounters(ev));
  });
  return args;
}

function appendResult(r: (string | null)[], count: number, peeked = false, reads = 0): AppendResult {
  if (r[0] === 'erased') return { ok: false, reason: 'erased' };
  if (r[0] === 'fenced') return { ok: false, reason: 'fenced', detail: r[1] === 'expired' ? 'expired' : 'mismatch' };
  if (r[0] === 'refused') return { ok: false, reason: 'refused', detail: r[1] === 'status' ? 'status' : 'absent' };
  const out: LogEvent[] = [];
  const duplicate: boolean[] = [];
  const end = 2 + 2 * count;
  for (let i = 2; i + 1 < end; i += 2) {
    const body = r[i] as string;
    // A replayed producer key whose event fell out of retention has no body left to return.
    if (body === '') continue;
    out.push(JSON.parse(body) as LogEvent);
    duplicate.push(r[i + 1] === 'dup');
  }
  const read = reads > 0 ? r.slice(end, end + reads).map((v) => v ?? null) : undefined;
  const base = { ok: true as const, events: out, duplicate, last_seq: Number(r[1]), ...(read ? { read } : {}) };
  if (!peeked) return base;
  const at = end + reads;
  const doc = r[at];
  const length = Number(r[at + 1]);
  const queued = length <= QUEUE_HEAD ? (r.slice(at + 2, at + 2 + length) as string[]) : undefined;
  return { ...base, peeked: doc === undefined || doc === null || doc === '' ? null : doc, ...(queued ? { queued } : {}) };
}

/** Span attributes of an append: the Session, how many events and their types (never their payloads). */
function appendAttributes(sessionId: string, events: readonly AppendEvent[]): Attributes {
  return {
    [ATTR.dbSystemName]: 'redis', [ATTR.dbOperationName]: 'append', 'agentplane.session.id': sessionId,
    'agentplane.events.count': events.length, 'agentplane.events.types': [...new Set(events.map((e) => e.type))],
  };
}

/**
 * How durable an acknowledged append is. Redis replicates asynchronously: by default an append is
 * acknowledged once its master has it, and a master lost before its replica caught up loses the
 * newest events of its slots (docs/CLUSTER.md measures it). With `waitReplicas` > 0 every append
 * is followed by `WAIT waitReplicas waitTimeoutMs` on the same master, and an append that fewer
 * replicas acknowledged in time fails with `AppendNotReplicatedError` instead of being
 * acknowledged (its writer retries with its producer key, which dedupes).
 */
export interface EventLogDurability {
  waitReplicas: number;
  waitTimeoutMs: number;
}

/** The settings every process that appends reads (the platform passes them on). */
export const APPEND_DURABILITY_ENV = ['EVENT_APPEND_WAIT_REPLICAS', 'EVENT_APPEND_WAIT_TIMEOUT_MS'] as const;

export function appendDurabilityFrom(env: Env): EventLogDurability {
  return {
    waitReplicas: envInt(env, 'EVENT_APPEND_WAIT_REPLICAS', 0, 0, 16),
    waitTimeoutMs: envInt(env, 'EVENT_APPEND_WAIT_TIMEOUT_MS', 1000, 1, 60_000),
  };
}

export class AppendNotReplicatedError extends Error {
  constructor(readonly acked: number, readonly wanted: number) {
    super(`the append reached ${acked} of ${wanted} replicas in time; it may be lost if its master fails (retry with the same producer key)`);
    this.name = 'AppendNotReplicatedError';
  }
}

/** One caller's append with `enqueue`, waiting to be joined with others into the same list (`EventLog.appendQueued`). */
interface QueuedAppend {
  sessionId: string;
  enqueue: NonNullable<AppendOptions['enqueue']>;
  /** How many events, and their script arguments (encoded in the caller's own call). */
  count: number;
  args: string[];
}

export class EventLog {
  /** Appends with `enqueue`, joined by Session, list, document and refusal (`appendQueued`). */
  private readonly queued = new Joiner<QueuedAppend, AppendResult>({
    schedule: (flush) => setImmediate(flush),
    send: (items) => this.sendQueued(items),
    maxWeight: MAX_APPEND_BATCH,
    weigh: (a) => a.count,
  });

  constructor(private readonly redis: Redis, private readonly durability: EventLogDurability = { waitReplicas: 0, waitTimeoutMs: 0 }) {}

  private async runDurably(script: LuaScript, keyList: readonly string[], args: readonly (string | number | Buffer)[], options: { reload?: boolean } = {}): Promise<unknown> {
    const { waitReplicas, waitTimeoutMs } = this.durability;
    if (waitReplicas <= 0) return script.run(this.redis, keyList, args, options);
    const { result, acked } = await script.runAndWait(this.redis, keyList, args, waitReplicas, waitTimeoutMs, options);
    // A refused append (stale fence, duplicate) wrote nothing that needs a replica.
    if (acked < waitReplicas && Array.isArray(result) && result[0] === 'ok') throw new AppendNotReplicatedError(acked, waitReplicas);
    return result;
  }

  /**
   * Append events atomically: producer-key dedupe, optional lease fence, sequence numbers,
   * `evt_` ids, `created_at` from the Redis clock, counters, and the live PUBLISH — one script.
   */
  async append(sessionId: string, events: readonly AppendEvent[], options: AppendOptions = {}): Promise<AppendResult> {
    if (events.length === 0 || !tracingEnabled()) return this.appendNow(sessionId, events, options);
    return inSpan('append session_events', { kind: SpanKind.CLIENT, attributes: appendAttributes(sessionId, events), parent: options.trace }, async (span) => {
      const r = await this.appendNow(sessionId, events, options);
      span.setAttribute('agentplane.append.outcome', r.ok ? 'ok' : r.reason);
      return r;
    });
  }

  private async appendNow(sessionId: string, events: readonly AppendEvent[], options: AppendOptions): Promise<AppendResult> {
    if (events.length === 0) {
      const st = await this.state(sessionId);
      if (st.erased) return { ok: false, reason: 'erased' };
      return { ok: true, events: [], duplicate: [], last_seq: st.seq };
    }
    if (options.enqueue && options.fence === undefined && options.producerKey === undefined) return this.appendQueued(sessionId, events, options.enqueue);
    const keyList = logKeys(sessionId);
    const args = appendArgs(sessionId, events, options);
    if (options.enqueue) {
      keyList.push(options.enqueue.list, options.enqueue.peek);
      args.push(options.enqueue.refuseStatus ?? '');
    }
    const r = (await this.runDurably(APPEND, keyList, args)) as string[];
    return appendResult(r, events.length, options.enqueue !== undefined);
  }

  /**
   * Appends queued into the same list in the same turn of the event loop (messages into one busy
   * thread, sent concurrently) go in one script, sent once every connection that was ready in
   * that turn has been read (`setImmediate`: each request arrives in an I/O callback of its own,
   * so a flush at the end of the tick would join nothing): one command and one live message
   * instead of one each. Each caller gets its own events, in call order, with the peeked document and the
   * queue as they were after the whole batch; a refusal (the document absent or refused, the log
   * erased) refuses every caller, as each would have been refused alone. Only appends without a
   * fence or a batch producer key are joined, and only with others into the same list: an append
   * of another kind never waits behind them.
   */
  private appendQueued(sessionId: string, events: readonly AppendEvent[], enqueue: NonNullable<AppendOptions['enqueue']>): Promise<AppendResult> {
    if (events.length > MAX_APPEND_BATCH) throw new RangeError(`at most ${MAX_APPEND_BATCH} events per append`);
    // Encoded here, so an event that cannot be encoded fails its own caller only.
    const args = eventArgs(sessionId, events, undefined);
    return this.queued.add(`${sessionId}\n${enqueue.list}\n${enqueue.peek}\n${enqueue.refuseStatus ?? ''}`, { sessionId, enqueue, count: events.length, args });
  }

  /** One script for appends that share a key: each caller gets its own events' results. */
  private async sendQueued(items: QueuedAppend[]): Promise<AppendResult[]> {
    const { sessionId, enqueue } = items[0] as QueuedAppend;
    const count = items.reduce((n, a) => n + a.count, 0);
    const keyList = logKeys(sessionId);
    keyList.push(enqueue.list, enqueue.peek);
    const r = (await this.runDurably(APPEND, keyList, [...appendHead(sessionId, count, undefined), ...items.flatMap((a) => a.args), enqueue.refuseStatus ?? ''])) as (string | null)[];
    if (r[0] !== 'ok') return items.map(() => appendResult(r, 0));
    // Per caller: its own events' pairs (body, new/dup), then what follows every event.
    const after = r.slice(2 + 2 * count);
    let at = 0;
    return items.map((a) => {
      const from = at;
      at += a.count;
      return appendResult(['ok', r[1] ?? null, ...r.slice(2 + 2 * from, 2 + 2 * at), ...after], a.count, true);
    });
  }

  /**
   * Write documents of this Session's slot and append events, atomically: every document is
   * checked first (its \`version\` for a compare-and-swap, absence for a new one); if any check
   * fails nothing is written. Then the events are appended exactly as by \`append\` (producer
   * keys, counters, PUBLISH). With \`fence\`, a stale or expired lease token refuses the whole
   * commit (\`fenced\`) before anything is written.
   */
  async commit(sessionId: string, docs: readonly CommitDoc[], events: readonly AppendEvent[], options: CommitOptions = {}): Promise<CommitResult> {
    if (!tracingEnabled()) return this.commitNow(sessionId, docs, events, options);
    return inSpan('append session_events', { kind: SpanKind.CLIENT, attributes: { ...appendAttributes(sessionId, events), 'agentplane.append.documents': docs.length }, parent: options.trace }, async (span) => {
      const r = await this.commitNow(sessionId, docs, events, options);
      span.setAttribute('agentplane.append.outcome', r.ok ? 'ok' : r.reason);
      return r;
    });
  }

  private async commitNow(sessionId: string, docs: readonly CommitDoc[], events: readonly AppendEvent[], options: CommitOptions): Promise<CommitResult> {
    if (events.length === 0) throw new RangeError('commit appends at least one event');
    const keyList = logKeys(sessionId);
    const args = appendArgs(sessionId, events, options);
    args.push(docs.length);
    for (const d of docs) {
      keyList.push(d.key);
      if (d.index) keyList.push(d.index.key);
      args.push(d.expectedVersion === null ? '' : String(d.expectedVersion), d.body, d.index ? '1' : '0', d.index?.score ?? 0, d.index?.member ?? '');
    }
    const dq = options.dequeue;
    if (dq && dq.ids.length > 0) {
      keyList.push(dq.list);
      args.push(dq.ids.length, ...dq.ids);
    } else if (options.emptyList !== undefined) {
      keyList.push(options.emptyList);
      args.push(-1);
    } else {
      args.push(0);
    }
    args.push(options.fresh ? '1' : '');
    if (options.peekList !== undefined) keyList.push(options.peekList);
    args.push(options.peekList !== undefined ? '1' : '');
    const reads = options.reads ?? [];
    args.push(reads.length);
    for (const rd of reads) {
      keyList.push(rd.key);
      args.push(rd.field ?? '');
    }
    if (options.claim) {
      keyList.push(options.claim.key);
      args.push('1', options.claim.field, options.claim.value, options.claim.replaces ?? '');
    } else {
      args.push('');
    }
    if (options.seqInto) {
      if (!options.fresh || events.length !== 1) throw new RangeError('seqInto needs a fresh commit of one event');
      args.push(options.seqInto.doc + 1, options.seqInto.field);
    } else {
      args.push('');
    }
    let r: (string | null)[];
    if (options.behind) {
      const sent = this.runDurably(COMMIT, keyList, args, { reload: false });
      options.behind();
      try {
        r = (await sent) as (string | null)[];
      } catch (err) {
        if (isNoScript(err)) return { ok: false, reason: 'unloaded' };
        throw err;
      }
    } else {
      r = (await this.runDurably(COMMIT, keyList, args)) as (string | null)[];
    }
    if (r[0] === 'stale') return { ok: false, reason: 'stale', index: Number(r[1]) - 1, current: r[2] as string };
    if (r[0] === 'missing' || r[0] === 'exists') return { ok: false, reason: r[0], index: Number(r[1]) - 1 };
    if (r[0] === 'queue') return { ok: false, reason: 'queue' };
    if (r[0] === 'replay') return { ok: false, reason: 'replay' };
    if (r[0] === 'claimed') return { ok: false, reason: 'claimed', holder: r[1] as string };
    return appendResult(r, events.length, options.peekList !== undefined, reads.length);
  }

  async state(sessionId: string): Promise<LogState> {
    const [seq, low, erased] = await this.redis.hmget(eventLogKeys.meta(sessionId), 'seq', 'low', 'erased');
    return { seq: Number(seq ?? 0), low: Number(low ?? 1), erased: erased !== null };
  }

  /** Events with `afterSeq < seq <= toSeq`, oldest first, at most `limit`. */
  async range(sessionId: string, afterSeq: number, limit: number, toSeq?: number): Promise<LogEvent[]> {
    const rows = (await this.redis.xrange(
      eventLogKeys.stream(sessionId), `${afterSeq + 1}-0`, toSeq === undefined ? '+' : `${toSeq}-0`, 'COUNT', limit,
    )) as [string, string[]][];
    return parseEntries(rows);
  }

  /** `range`, each event with the bytes of its stored JSON (a page bounded by size, not only by count). */
  async rangeSized(sessionId: string, afterSeq: number, limit: number): Promise<{ event: LogEvent; bytes: number }[]> {
    const rows = (await this.redis.xrange(eventLogKeys.stream(sessionId), `${afterSeq + 1}-0`, '+', 'COUNT', limit)) as [string, string[]][];
    const out: { event: LogEvent; bytes: number }[] = [];
    for (const [, fields] of rows) {
      const i = fields.indexOf('e');
      const body = i >= 0 ? fields[i + 1] : undefined;
      if (body !== undefined) out.push({ event: JSON.parse(body) as LogEvent, bytes: body.length });
    }
    return out;
  }

  /** Events with `seq < beforeSeq`, newest first, at most `limit`. */
  async rangeBackward(sessionId: string, beforeSeq: number | null, limit: number): Promise<LogEvent[]> {
    const end = beforeSeq === null ? '+' : `${beforeSeq - 1}-0`;
    if (beforeSeq !== null && beforeSeq <= 1) return [];
    const rows = (await this.redis.xrevrange(eventLogKeys.stream(sessionId), end, '-', 'COUNT', limit)) as [string, string[]][];
    return parseEntries(rows);
  }

  /** Session delete: the stream and its side keys go; the `erased` marker stays so readers see a gap. */
  async erase(sessionId: string): Promise<number> {
    const k = eventLogKeys;
    return Number(await ERASE.run(
      this.redis,
      [k.stream(sessionId), k.meta(sessionId), k.producers(sessionId), k.producersTs(sessionId), k.stats(sessionId), k.lease(sessionId)],
      [k.liveChannel(sessionId)],
    ));
  }

  /** Retention: drop events with seq <= `throughSeq`. Readers get a gap frame for the range. Returns the new `low`. */
  async trimThrough(sessionId: string, throughSeq: number): Promise<number> {
    return Number(await TRIM.run(this.redis, [eventLogKeys.stream(sessionId), eventLogKeys.meta(sessionId)], [throughSeq]));
  }

  /** Counters of the stats hash: `s.<name>` for the Session, `t.<thread>.<name>` per thread. */
  async counters(sessionId: string): Promise<Record<string, string>> {
    return this.redis.hgetall(eventLogKeys.stats(sessionId));
  }

  /** Set a lease fence token (the lease keeper's side; here for completeness and tests). */
  async setLease(sessionId: string, token: string, expiresAtMs: number): Promise<void> {
    await this.redis.hset(eventLogKeys.lease(sessionId), `t:${token}`, String(expiresAtMs));
  }

  /** Publish an uncursored preview fragment; viewers that asked for `event_deltas` receive it. */
  async publishDelta(sessionId: string, delta: DeltaMessage): Promise<void> {
    await this.redis.publish(eventLogKeys.deltaChannel(sessionId), JSON.stringify(delta));
  }
}
