import { ApiError, newId, nowIso, type Context } from '@agentplane/core';
import { BoundedCache, DOC_SWAP_LUA, docSwapResult, DocumentStore, EventLog, eventLogKeys, forgetWritten, keys, LuaScript, newEventId, primeCache, tags, type AppendEvent, type CommitClaim, type CommitDoc, type CommitResult, type SwapOutcome, type Tag, type EventLogDurability, type LogEvent, type Redis } from '@agentplane/store';
import type { AgentSnapshot } from '../agents/model.js';
import type { GraderRunInfo, RunDoc, SessionDoc, SessionTombstone, ThreadDoc } from './model.js';

/**
 * Session, thread and run documents. Everything of one Session lives in its `{s:<sess>}`
 * slot; the workspace keeps only listing indexes (`{w:<ws>}` zsets scored by created ms):
 *
 *   sessions:all, sessions:live (not archived),
 *   sessions:agent:<agent>:all|live, sessions:automation:<id>:all|live
 *
 * Index writes follow the document write (a crash in between leaves a Session reachable by
 * id but missing from lists; never the reverse, so a list never shows a dangling id).
 */
export const sessionTag = tags.session;

/** The most threads a Session's close marks in its one script (a coordinator's children included). */
const MAX_CLOSED_THREADS = 10_000;

/** The list of user.message ids queued for a thread's next turn (in the Session's slot). */
export function inputQueueKey(sessionId: string, threadId: string): string {
  return keys.scoped(sessionTag(sessionId), `inputs:${threadId}`);
}

/** Thread id → the id of its outcome under way (docs/OUTCOMES.md): a hash in the Session's slot. */
export function activeOutcomesKey(sessionId: string): string {
  return keys.scoped(sessionTag(sessionId), 'outcomes:active');
}

export function listIndexes(s: Pick<SessionDoc, 'agent' | 'automation_id'>, live: boolean): string[] {
  const suffixes = live ? ['all', 'live'] : ['all'];
  const out = suffixes.map((x) => `sessions:${x}`);
  for (const x of suffixes) out.push(`sessions:agent:${s.agent.id}:${x}`);
  if (s.automation_id) for (const x of suffixes) out.push(`sessions:automation:${s.automation_id}:${x}`);
  return out;
}

/** A new turn of a thread: the Run that `SessionStore.startTurn` records with the thread's change. */
export interface TurnStart {
  runId: string;
  /** The user.message events the turn answers. */
  inputs: string[];
  /** A continuation Run: the Run whose blocking tool uses were answered. */
  continuesRunId?: string | null;
  /** A grader Run of an outcome evaluation (docs/OUTCOMES.md). */
  grader?: GraderRunInfo;
  /** The ids of `inputs` taken off the head of the thread's input queue (checked by the script). */
  dequeue?: string[];
}

/** The thread's input queue changed under a turn start (another start took its head): read it again. */
export class InputQueueMoved extends Error {
  constructor() {
    super('the input queue changed; read it again');
  }
}

/**
 * A document written by a turn end's own script beside the thread (its compare-and-swap from
 * `expectedVersion`), or not at all: the Run whose end it is. `written` is set once the end's
 * script wrote it; a turn end that cannot write it with the thread (the thread does not move, the
 * document moved or is gone, the Session's log is erased) writes nothing and throws `RideRefused`.
 */
export interface RunRide extends CommitDoc {
  written?: boolean;
}

/** A turn end carrying a `RunRide` wrote nothing: the caller writes the Run and ends the turn on its own. */
export class RideRefused extends Error {
  constructor(why: string) {
    super(`the Run's end could not ride on the turn end: ${why}`);
  }
}

/**
 * A new Session's documents in its slot, unless a document of its id exists: the primary thread,
 * the thread's place in the thread index, the Session. KEYS: the Session's document, the thread's
 * document, the thread index. ARGV: the Session's JSON, the thread's JSON, the thread's id.
 * Returns the existing document's JSON (nothing written), or nil (written).
 */
const CREATE_SESSION = new LuaScript('session_create', `
local cur = redis.call('GET', KEYS[1])
if cur then return cur end
redis.call('SET', KEYS[2], ARGV[2])
redis.call('ZADD', KEYS[3], 0, ARGV[3])
redis.call('SET', KEYS[1], ARGV[1])
return false`);

/**
 * Lua: queue a user.message for the thread's next turn unless it is queued already, and return the
 * thread document. KEYS: the input queue, the thread document. ARGV: the event id.
 */
const ENQUEUE_INPUT = new LuaScript('thread_enqueue_input', `
if not redis.call('LPOS', KEYS[1], ARGV[1]) then redis.call('RPUSH', KEYS[1], ARGV[1]) end
return redis.call('GET', KEYS[2])`);

/**
 * Lua: queue a thread's first input, only while no turn has started on it (idle, no Run, no stop
 * reason, none ended): a start repeated after another attempt started the thread queues nothing,
 * so the input is never taken twice. KEYS and ARGV as `ENQUEUE_INPUT`'s. Returns the thread
 * document when the input is queued, false when the thread ran already (or is gone).
 */
const ENQUEUE_FIRST_INPUT = new LuaScript('thread_enqueue_first_input', `
local raw = redis.call('GET', KEYS[2])
if not raw then return false end
local t = cjson.decode(raw)
local function none(v) return v == nil or v == cjson.null end
if t.status ~= 'idle' or not none(t._active_run_id) or not none(t._stop_reason) or not none(t._ended_run_id) then return false end
if not redis.call('LPOS', KEYS[1], ARGV[1]) then redis.call('RPUSH', KEYS[1], ARGV[1]) end
return raw`);

/**
 * A child thread's document and its place in the Session's thread index, in one script, unless
 * the Session's log was erased: a spawn that races the Session's delete writes nothing (the
 * erase lists the threads it deletes after it marks the log erased, so every child written
 * before the mark is deleted with it, and none is written after it).
 * The spawn counter its spawn number was taken from goes too then (the erase deleted it; the
 * reservation made it again).
 * KEYS: the log's meta hash, the thread document, the thread index, the spawn counter.
 * ARGV: JSON, spawn, id. Returns 1 (written), 0 (erased) or -1 (a document of that id exists).
 */
/**
 * A thread's compare-and-swap (DOC_SWAP_LUA on KEYS[1]) made only while its input queue
 * (KEYS[2]) is empty: {2, n} with n messages queued, else doc_swap's answer.
 */
const SWAP_IF_NO_INPUT = new LuaScript('thread_swap_if_no_input', `${DOC_SWAP_LUA}
local queued = redis.call('LLEN', KEYS[2])
if queued > 0 then return {2, queued} end
return doc_swap(KEYS[1], ARGV[1], ARGV[2])`);

const CREATE_CHILD = new LuaScript('thread_create_child', `
if redis.call('HEXISTS', KEYS[1], 'erased') == 1 then
  redis.call('DEL', KEYS[4])
  return 0
end
if not redis.call('SET', KEYS[2], ARGV[1], 'NX') then return -1 end
redis.call('ZADD', KEYS[3], ARGV[2], ARGV[3])
return 1`);

/**
 * Thread documents this process read or wrote last, as JSON, by `<session>/<thread>`: the first
 * guess of the next compare-and-swap on that thread (the drive path reads the thread, appends,
 * then changes it). Only ever a guess: Redis checks its version before anything is written.
 * Bounded in count, total size (~8 MiB of JSON) and age.
 */
const THREAD_GUESSES = { entries: 4096, maxWeight: 8 * 1024 * 1024, maxAgeMs: 10_000 };

/**
 * A remembered thread: its JSON, and the JSON parsed once for `peekThread`'s readers (who never
 * change it). A compare-and-swap parses its own copy from the JSON: its mutation may change it.
 */
interface ThreadGuess {
  raw: string;
  parsed?: ThreadDoc;
}

export class SessionStore {
  readonly docs: DocumentStore;
  readonly log: EventLog;
  private readonly recentThreads = new BoundedCache<string, ThreadGuess>(THREAD_GUESSES.entries, {
    maxAgeMs: THREAD_GUESSES.maxAgeMs, maxWeight: THREAD_GUESSES.maxWeight, weigh: (guess) => guess.raw.length,
  });

  constructor(readonly redis: Redis, durability?: EventLogDurability) {
    this.docs = new DocumentStore(redis);
    this.log = new EventLog(redis, durability);
  }

  /**
   * Writes a new Session: its primary thread, the thread's place in the Session's thread index and
   * the Session's document in one script (a Session is never found without its primary thread),
   * then its places in the Workspace's lists. When a document of that id exists already (a
   * Session, or the tombstone of one, that an earlier attempt of the same keyed create wrote),
   * nothing is written and that document is returned; null when this call wrote the Session.
   */
  async create(session: SessionDoc, primary: ThreadDoc): Promise<SessionDoc | SessionTombstone | null> {
    const tag = sessionTag(session.id);
    const existing = (await CREATE_SESSION.run(this.redis, [keys.doc(tag, session.id), keys.doc(tag, primary.id), keys.index(tag, 'threads')], [
      JSON.stringify(session), JSON.stringify(primary), primary.id,
    ])) as string | null;
    if (existing !== null) return JSON.parse(existing) as SessionDoc | SessionTombstone;
    // Its stream and its first message read it next: read it into the cache now, off their path.
    primeCache(this.redis, [keys.doc(tag, session.id)]);
    await this.listed(session);
    // A new Session's first message usually follows at once: its thread is known without a read.
    this.rememberThread(primary);
    return null;
  }

  /**
   * The Session's places in the Workspace's lists (another slot than its documents, so written
   * after them): written again by a keyed create's retry, whose first attempt may have died
   * between the two. An archived Session is in the lists of all Sessions only.
   */
  async listed(session: Pick<SessionDoc, 'id' | 'workspace_id' | 'created_at' | 'agent' | 'automation_id' | 'archived_at'>): Promise<void> {
    const ws = tags.workspace(session.workspace_id);
    const score = Date.parse(session.created_at);
    const multi = this.redis.multi();
    for (const idx of listIndexes(session, session.archived_at === null)) multi.zadd(keys.index(ws, idx), score, session.id);
    await multi.exec();
  }

  /** The events the Runs of the Session took as their input (a keyed create's retry queues only the others). */
  async takenInputs(sessionId: string): Promise<Set<string>> {
    const tag = sessionTag(sessionId);
    const ids = await this.redis.zrange(keys.index(tag, 'runs'), 0, -1);
    const raw = ids.length > 0 ? await this.redis.mget(ids.map((id) => keys.doc(tag, id))) : [];
    const taken = new Set<string>();
    for (const r of raw) if (r) for (const e of (JSON.parse(r) as Partial<RunDoc>).input_event_ids ?? []) taken.add(e);
    return taken;
  }

  /** The live Session of this workspace, or 404 (another workspace's Session looks absent; an erased one too, with a message saying so). */
  async get(workspaceId: string, id: string): Promise<SessionDoc> {
    const doc = await this.docs.getCached<SessionDoc | SessionTombstone>(sessionTag(id), id);
    if (!doc || doc.workspace_id !== workspaceId) throw new ApiError('validation.not_found', 'session not found');
    if (doc.type === 'session_tombstone') throw new ApiError('validation.not_found', 'the session was deleted and its event log erased');
    return doc;
  }

  /**
   * Like get, as the read cache's one parsed copy shared by every reader (no parse when cached):
   * for a request that only reads the Session (a drive event). Never change it.
   */
  async getShared(workspaceId: string, id: string): Promise<Readonly<SessionDoc>> {
    const doc = await this.docs.getShared<SessionDoc | SessionTombstone>(sessionTag(id), id);
    if (!doc || doc.workspace_id !== workspaceId) throw new ApiError('validation.not_found', 'session not found');
    if (doc.type === 'session_tombstone') throw new ApiError('validation.not_found', 'the session was deleted and its event log erased');
    return doc;
  }

  /** Like getShared (read it, never change it), but an erased Session returns its tombstone (streams report the gap). */
  async getOrTombstone(workspaceId: string, id: string): Promise<Readonly<SessionDoc | SessionTombstone>> {
    const doc = await this.docs.getShared<SessionDoc | SessionTombstone>(sessionTag(id), id);
    if (!doc || doc.workspace_id !== workspaceId) throw new ApiError('validation.not_found', 'session not found');
    return doc;
  }

  update(workspaceId: string, id: string, mutate: (s: SessionDoc) => SessionDoc | null): Promise<SessionDoc> {
    return this.docs.update<SessionDoc>(sessionTag(id), id, (cur) => {
      if ((cur as unknown as SessionTombstone).type === 'session_tombstone') throw new ApiError('validation.not_found', 'the session was deleted');
      if (cur.workspace_id !== workspaceId) throw new ApiError('validation.not_found', 'session not found');
      return mutate(cur);
    }, { notFound: 'session' });
  }

  async archive(workspaceId: string, id: string): Promise<SessionDoc> {
    const s = await this.update(workspaceId, id, (cur) => (cur.archived_at !== null ? null : { ...cur, archived_at: nowIso() }));
    const ws = tags.workspace(workspaceId);
    const multi = this.redis.multi();
    for (const idx of listIndexes(s, true)) if (idx.endsWith(':live')) multi.zrem(keys.index(ws, idx), id);
    await multi.exec();
    return s;
  }

  /**
   * Erase: lists first, then the log (with its erased marker), then the documents; retry-safe.
   * `listings`: further listings of the Workspace that name the Session (index names in its
   * `{w:<ws>}` slot, as `keys.index` takes them: an A2A caller's task index), left in the same
   * transaction as the Session's own listings.
   */
  async erase(workspaceId: string, id: string, options: { listings?: (s: Readonly<SessionDoc>) => readonly string[] } = {}): Promise<void> {
    const doc = await this.getOrTombstone(workspaceId, id);
    if (doc.type === 'session_tombstone') return;
    const ws = tags.workspace(workspaceId);
    const multi = this.redis.multi();
    for (const idx of [...listIndexes(doc, true), ...(options.listings?.(doc) ?? [])]) multi.zrem(keys.index(ws, idx), id);
    await multi.exec();
    await this.log.erase(id);
    const tag = sessionTag(id);
    const threadIds = await this.redis.zrange(keys.index(tag, 'threads'), 0, -1);
    const runIds = await this.redis.zrange(keys.index(tag, 'runs'), 0, -1);
    const now = nowIso();
    const tomb: SessionTombstone = { id, type: 'session_tombstone', workspace_id: workspaceId, erased_at: now, version: doc.version + 1, created_at: doc.created_at, updated_at: now,
      ...(doc._keyed_fingerprint !== undefined ? { _keyed_fingerprint: doc._keyed_fingerprint } : {}),
    };
    const m = this.redis.multi();
    for (const t of [...threadIds, ...runIds]) m.del(keys.doc(tag, t));
    for (const t of threadIds) m.del(inputQueueKey(id, t));
    for (const o of await this.redis.zrange(keys.index(tag, 'outcomes'), 0, -1)) m.del(keys.doc(tag, o));
    m.del(keys.index(tag, 'threads'), keys.index(tag, 'runs'), keys.index(tag, 'outcomes'), activeOutcomesKey(id), keys.scoped(tag, 'spawn'), keys.scoped(tag, 'delegations'));
    m.set(keys.doc(tag, id), JSON.stringify(tomb));
    await m.exec();
    forgetWritten(this.redis, [keys.doc(tag, id), ...threadIds.map((t) => keys.doc(tag, t))]);
  }

  // ---- threads ---------------------------------------------------------------------------

  /**
   * The ids of the user.message events waiting for the thread's next turn, in arrival order.
   * (Threads written by an earlier version may also hold some in the document's `_queued_inputs`;
   * they come first.)
   */
  async queuedInputs(sessionId: string, threadId: string): Promise<string[]> {
    return this.redis.lrange(inputQueueKey(sessionId, threadId), 0, -1);
  }

  /** Queue an appended user.message for the thread's next turn (once); returns the thread as read then. */
  async enqueueInput(sessionId: string, threadId: string, eventId: string): Promise<ThreadDoc | null> {
    const raw = (await ENQUEUE_INPUT.run(this.redis, [inputQueueKey(sessionId, threadId), keys.doc(sessionTag(sessionId), threadId)], [eventId])) as string | null;
    return raw ? this.rememberedThread(raw) : null;
  }

  /**
   * Queues a thread's first input (`ENQUEUE_FIRST_INPUT`): the thread as it was when queued, or null
   * when a turn has started on it already (nothing queued).
   */
  async enqueueFirstInput(sessionId: string, threadId: string, eventId: string): Promise<ThreadDoc | null> {
    const raw = (await ENQUEUE_FIRST_INPUT.run(this.redis, [inputQueueKey(sessionId, threadId), keys.doc(sessionTag(sessionId), threadId)], [eventId])) as string | null;
    return raw ? this.rememberedThread(raw) : null;
  }

  /** A thread document's JSON as read by a script: parsed, checked and remembered for the next compare-and-swap. */
  rememberedThread(raw: string): ThreadDoc | null {
    const t = JSON.parse(raw) as ThreadDoc;
    if (t.type !== 'session_thread') return null;
    this.recentThreads.set(`${t.session_id}/${t.id}`, { raw });
    return t;
  }

  /**
   * The thread as this process knows it now, without waiting: from the read cache, else as this
   * process last read or wrote it (the compare-and-swap guesses: a thread taking messages is
   * known from the last append's reply). Undefined when neither knows it, null when the cache
   * knows it is absent. Possibly stale: for decisions Redis checks again. Never change it.
   */
  peekThread(sessionId: string, threadId: string): Readonly<ThreadDoc> | null | undefined {
    const ours = (t: Readonly<ThreadDoc>): boolean => t.type === 'session_thread' && t.session_id === sessionId;
    const t = this.docs.peekShared<ThreadDoc>(sessionTag(sessionId), threadId);
    if (t !== undefined) return t !== null && ours(t) ? t : null;
    const guess = this.recentThreads.get(`${sessionId}/${threadId}`);
    if (guess === undefined) return undefined;
    const g = (guess.parsed ??= JSON.parse(guess.raw) as ThreadDoc);
    return ours(g) && g.id === threadId ? g : undefined;
  }

  async thread(sessionId: string, threadId: string): Promise<ThreadDoc> {
    const t = await this.docs.getCached<ThreadDoc>(sessionTag(sessionId), threadId);
    if (!t || t.type !== 'session_thread' || t.session_id !== sessionId) throw new ApiError('validation.not_found', 'thread not found');
    this.rememberThread(t);
    return t;
  }

  updateThread(sessionId: string, threadId: string, mutate: (t: ThreadDoc) => ThreadDoc | null): Promise<ThreadDoc> {
    return this.changeThread(sessionId, threadId, (t) => {
      const next = mutate(t);
      return next === null ? null : { thread: next };
    }).then((r) => r.thread);
  }

  /**
   * A compare-and-swap on a thread that, when it terminates the thread, is made only while no
   * message waits in its input queue (an archive: a message the append script queued while the
   * thread was not terminated starts its next turn and must not be left behind a terminated
   * thread). With messages queued: 409 `runtime.invalid_transition`, nothing written.
   */
  terminateThreadIfNoInput(sessionId: string, threadId: string, mutate: (t: ThreadDoc) => ThreadDoc | null): Promise<ThreadDoc> {
    const tag = sessionTag(sessionId);
    let terminates = false;
    return this.swapThread(sessionId, threadId, (t) => {
      const next = mutate(t);
      terminates = next !== null && t.status !== 'terminated' && next.status === 'terminated';
      return next;
    }, async (next, expected) => {
      if (!terminates) return this.docs.swap(tag, threadId, next, expected);
      const r = (await SWAP_IF_NO_INPUT.run(this.redis, [keys.doc(tag, threadId), inputQueueKey(sessionId, threadId)], [String(expected), JSON.stringify(next)])) as unknown[];
      if (r[0] === 2) {
        throw new ApiError('runtime.invalid_transition', `the thread has ${Number(r[1])} message(s) queued that start its next turn; archive it once that turn is over, or interrupt it with user.interrupt first`);
      }
      return docSwapResult(r).outcome;
    }).then((thread) => {
      this.rememberThread(thread);
      return thread;
    });
  }

  /**
   * A compare-and-swap on a thread that may start a turn. When `mutate` returns `start`, the
   * new Run (`queued`, listed in `runs`) and `session.status_running` (producer key
   * `status:<run>:running`) are written by the same script as the thread: a turn is recorded
   * whole or not at all. An erased Session refuses with 404 and writes nothing.
   */
  async startTurn(
    session: SessionDoc,
    threadId: string,
    mutate: (t: ThreadDoc) => { thread: ThreadDoc; start?: TurnStart } | null,
    trace?: Context,
  ): Promise<{ thread: ThreadDoc; run: RunDoc | null }> {
    return this.changeThread(session.id, threadId, mutate, session, trace);
  }

  private async changeThread(
    sessionId: string,
    threadId: string,
    mutate: (t: ThreadDoc) => { thread: ThreadDoc; start?: TurnStart } | null,
    session?: SessionDoc,
    trace?: Context,
  ): Promise<{ thread: ThreadDoc; run: RunDoc | null }> {
    const tag = sessionTag(sessionId);
    let start: TurnStart | undefined;
    let run: RunDoc | null = null;
    const thread = await this.swapThread(sessionId, threadId, (t) => {
      start = undefined;
      run = null;
      const out = mutate(t);
      if (out === null) return null;
      // The Session's terminal status event is written, or the Session is archived: no turn starts.
      if (out.start && (t._closed === true || t._archived === true)) return null;
      if (out.start && !session) throw new Error('startTurn needs the Session');
      start = out.start;
      return out.thread;
    }, async (next, expected) => {
      if (!start || !session) return this.docs.swap(tag, threadId, next, expected);
      const candidate = turnRun(session, next, start);
      const { docs, running } = turnStartWrites(next, expected, candidate);
      const r = await this.log.commit(sessionId, docs, [running],
        start.dequeue && start.dequeue.length > 0 ? { dequeue: { list: inputQueueKey(sessionId, threadId), ids: start.dequeue }, trace } : { trace });
      if (r.ok) {
        run = candidate;
        return { kind: 'written' };
      }
      if (r.reason === 'erased') throw new ApiError('validation.not_found', 'the session was deleted and its event log erased');
      if (r.reason === 'stale' && r.index === 0) return { kind: 'stale', current: r.current };
      if (r.reason === 'missing' && r.index === 0) return { kind: 'missing' };
      if (r.reason === 'queue') throw new InputQueueMoved();
      throw new Error(`run ${candidate.id} could not be recorded: ${r.reason}`);
    });
    this.rememberThread(thread);
    return { thread, run };
  }

  /**
   * A compare-and-swap on a thread that ends its turn, with `idle` (its `session.status_idle`)
   * appended by the same script: the end is recorded whole or not at all. `appended`: this call
   * wrote the thread (and so the event); false when `mutate` left the thread as it was. `queued`:
   * the thread's input queue as that script left it (when short; read after the thread's end, as
   * the next turn's start needs). `activeOutcome`: the id of the thread's outcome under way as
   * the same script read it (null: none), the turn-end hook's first read; absent when the call
   * did not append. The thread of an erased Session is written alone (its log takes nothing more).
   * `idle` may be a function, called when the thread is written (after `mutate`), for an end whose
   * events depend on the thread as `mutate` found it (the last of them its `session.status_idle`).
   */
  async endTurnWith(
    sessionId: string, threadId: string, mutate: (t: ThreadDoc) => ThreadDoc | null, idle: AppendEvent | (() => AppendEvent[]), trace?: Context, ride?: RunRide,
  ): Promise<{ thread: ThreadDoc; appended: boolean; queued?: string[]; activeOutcome?: string | null }> {
    const tag = sessionTag(sessionId);
    let appended = false;
    let queued: string[] | undefined;
    let activeOutcome: string | null | undefined;
    const thread = await this.swapThread(sessionId, threadId, (t) => {
      appended = false;
      return mutate(t);
    }, async (next, expected) => {
      const thread = { key: keys.doc(tag, threadId), body: JSON.stringify(next), expectedVersion: expected };
      const r = await this.log.commit(sessionId, ride ? [thread, ride] : [thread], typeof idle === 'function' ? idle() : [idle],
        { trace, peekList: inputQueueKey(sessionId, threadId), reads: [{ key: activeOutcomesKey(sessionId), field: threadId }] });
      if (r.ok) {
        appended = true;
        queued = r.queued;
        activeOutcome = r.read?.[0] ?? null;
        if (ride) ride.written = true;
        return { kind: 'written' };
      }
      if (ride && (r.reason === 'erased' || ((r.reason === 'stale' || r.reason === 'missing') && r.index === 1))) throw new RideRefused(r.reason);
      return this.threadNotCommitted(r, tag, threadId, next, expected, `the turn end of thread ${threadId} could not be recorded`);
    });
    this.rememberThread(thread);
    return { thread, appended, ...(queued ? { queued } : {}), ...(appended && activeOutcome !== undefined ? { activeOutcome } : {}) };
  }

  /**
   * A thread's compare-and-swap with events whose commit did not go through, answered as
   * `docs.update`'s write answers: the thread of an erased Session is written alone (its log
   * takes nothing more); a stale or missing thread is retried or refused there; anything else is
   * a fault (`what`).
   */
  private threadNotCommitted(r: CommitResult, tag: Tag, threadId: string, next: ThreadDoc, expected: number, what: string): Promise<SwapOutcome> | SwapOutcome {
    if (r.ok) return { kind: 'written' };
    if (r.reason === 'erased') return this.docs.swap(tag, threadId, next, expected);
    if (r.reason === 'stale') return { kind: 'stale', current: r.current };
    if (r.reason === 'missing') return { kind: 'missing' };
    throw new Error(`${what}: ${r.reason}`);
  }

  /**
   * A compare-and-swap on a thread with `event` appended by the same script: both or neither.
   * `appended`: this call wrote them; false when `mutate` left the thread as it was. The thread
   * of an erased Session is written alone (its log takes nothing more).
   */
  async updateThreadWith(
    sessionId: string, threadId: string, mutate: (t: ThreadDoc) => ThreadDoc | null, event: AppendEvent, trace?: Context,
  ): Promise<{ thread: ThreadDoc; appended: boolean }> {
    const tag = sessionTag(sessionId);
    let appended = false;
    const thread = await this.swapThread(sessionId, threadId, (t) => {
      appended = false;
      return mutate(t);
    }, async (next, expected) => {
      const r = await this.log.commit(sessionId, [{ key: keys.doc(tag, threadId), body: JSON.stringify(next), expectedVersion: expected }], [event], { trace });
      if (r.ok) {
        appended = true;
        return { kind: 'written' };
      }
      return this.threadNotCommitted(r, tag, threadId, next, expected, `thread ${threadId} could not be written with its event`);
    });
    this.rememberThread(thread);
    return { thread, appended };
  }

  /**
   * A compare-and-swap on a thread, from the copy this process remembers when it has one (else
   * read), written by `write` (a commit that writes the thread with events).
   */
  private swapThread(sessionId: string, threadId: string, mutate: (t: ThreadDoc) => ThreadDoc | null, write: (next: ThreadDoc, expected: number) => Promise<SwapOutcome>): Promise<ThreadDoc> {
    const hint = this.recentThreads.take(`${sessionId}/${threadId}`);
    return this.docs.update<ThreadDoc>(sessionTag(sessionId), threadId, mutate, {
      notFound: 'thread',
      ...(hint !== undefined ? { current: JSON.parse(hint.raw) as ThreadDoc } : {}),
      write,
    });
  }

  /**
   * An answer to a thread's wait, in one script: `mutate` records it on the thread (the wait's
   * `answered_seq` holding `SEQ_PLACEHOLDER`) and `event` is appended, both or neither, the
   * event's seq written into the wait. So an answer refused by the thread's compare-and-swap (an
   * interrupt ended the wait meanwhile) leaves nothing in the log. `event` null: `mutate` left
   * the thread as it was (answered meanwhile). An erased Session takes no answer (404).
   */
  async answerWait(
    sessionId: string, threadId: string, toolUseId: string, mutate: (t: ThreadDoc) => ThreadDoc | null, event: AppendEvent, trace?: Context,
  ): Promise<{ thread: ThreadDoc; event: LogEvent | null; logged?: true }> {
    const tag = sessionTag(sessionId);
    let appended: LogEvent | null = null;
    const logged = new Error('logged apart');
    const written = await this.swapThread(sessionId, threadId, (t) => {
      appended = null;
      return mutate(t);
    }, async (next, expected) => {
      const r = await this.log.commit(sessionId, [{ key: keys.doc(tag, threadId), body: JSON.stringify(next), expectedVersion: expected }], [event], {
        trace, fresh: true, seqInto: { doc: 0, field: 'answered_seq' },
      });
      if (r.ok) {
        appended = r.events[0] ?? null;
        return { kind: 'written' };
      }
      if (r.reason === 'erased') throw new ApiError('validation.not_found', 'the session was deleted and its event log erased');
      // Its producer key is known: an answer an earlier version logged apart from its record
      // (and died before the record). Nothing is written: the caller records that one.
      if (r.reason === 'replay') throw logged;
      return this.threadNotCommitted(r, tag, threadId, next, expected, `thread ${threadId} could not be written with its answer`);
    }).catch((err: unknown) => {
      if (err === logged) return null;
      throw err;
    });
    if (written === null) return { thread: await this.thread(sessionId, threadId), event: null, logged: true };
    const ev = appended as LogEvent | null;
    const w = written._waits[toolUseId];
    // The thread as stored: the seq in place of the placeholder.
    const thread = ev && w ? { ...written, _waits: { ...written._waits, [toolUseId]: { ...w, answered_seq: ev.seq } } } : written;
    this.rememberThread(thread);
    return { thread, event: ev };
  }

  /**
   * A message that starts its thread's turn, in one script: the message, the thread's
   * compare-and-swap from `known` (as the caller knows it) to `next`, the Run (its one input: the
   * message) and `session.status_running`. Nothing is written, and null comes back, when the
   * thread moved on from `known`, messages wait in its input queue, or the message replays an
   * earlier append (its producer key): the caller then appends and starts as usual. An erased
   * Session refuses with 404.
   */
  async startTurnWithMessage(
    session: SessionDoc, known: Readonly<ThreadDoc>, message: AppendEvent, next: ThreadDoc, runId: string, trace?: Context,
    /**
     * Asked with the Run about to be written: what goes right behind the start, if anything (the
     * Run to write instead, and `send`, called once the start is issued, before it is answered:
     * `CommitOptions.behind`).
     */
    behind?: (run: RunDoc) => { run: RunDoc; send: () => void } | undefined,
  ): Promise<{ event: LogEvent; thread: ThreadDoc; run: RunDoc } | null> {
    const threadId = known.id;
    const id = newEventId();
    const thread: ThreadDoc = { ...next, version: known.version + 1, updated_at: nowIso() };
    const built = turnRun(session, thread, { runId, inputs: [id] });
    const job = behind?.(built);
    const run = job?.run ?? built;
    const { docs, running } = turnStartWrites(thread, known.version, run);
    const r = await this.log.commit(session.id, docs, [{ ...message, id, session_thread_id: threadId }, running],
      { emptyList: inputQueueKey(session.id, threadId), fresh: true, trace, ...(job ? { behind: job.send } : {}) });
    if (!r.ok) {
      if (r.reason === 'erased') throw new ApiError('validation.not_found', 'the session was deleted and its event log erased');
      if (r.reason === 'stale' && r.index === 0) this.recentThreads.set(`${session.id}/${threadId}`, { raw: r.current });
      return null;
    }
    const event = r.events[0];
    if (!event) return null;
    this.rememberThread(thread);
    return { event, thread, run };
  }

  /**
   * A turn that starts with events of its own, in one script: `events` first (none may name an
   * earlier append by its producer key: `fresh`), the thread's compare-and-swap from `known` to
   * `next`, the Run `start` describes (`queued`, listed in `runs`), its `session.status_running`,
   * and `docs` beside them (an outcome's document). The thread's input queue must start with
   * `start.dequeue` (taken off it), or be empty when there is none; `claim` is a hash field of
   * the Session's slot the same script takes (`CommitOptions.claim`). The commit's answer comes
   * back as it is, for the caller to read (a stale thread, a moved queue, a held claim, a
   * replay), with the Run that it wrote when it is ok.
   */
  async startTurnWithEvents(
    session: SessionDoc, known: Readonly<ThreadDoc>, next: ThreadDoc, start: TurnStart, events: readonly AppendEvent[],
    options: { docs?: readonly CommitDoc[]; claim?: CommitClaim; trace?: Context | undefined } = {},
  ): Promise<{ result: CommitResult; run: RunDoc }> {
    const threadId = known.id;
    const thread: ThreadDoc = { ...next, version: known.version + 1, updated_at: nowIso() };
    const run = turnRun(session, thread, start);
    const { docs, running } = turnStartWrites(thread, known.version, run);
    const queue = inputQueueKey(session.id, threadId);
    const result = await this.log.commit(session.id, [...docs, ...(options.docs ?? [])], [...events, running], {
      fresh: true, trace: options.trace,
      ...(start.dequeue && start.dequeue.length > 0 ? { dequeue: { list: queue, ids: start.dequeue } } : { emptyList: queue }),
      ...(options.claim ? { claim: options.claim } : {}),
    });
    if (result.ok) this.rememberThread(thread);
    else if (result.reason === 'stale' && result.index === 0) this.recentThreads.set(`${session.id}/${threadId}`, { raw: result.current });
    return { result, run };
  }

  /**
   * The Session's terminal status event, once. When the Session is archived and no thread has a
   * turn under way (none `running` or `rescheduling`), one script marks every thread closed (a
   * compare-and-swap on each: a thread that moved meanwhile makes it stale, and it is tried
   * again) and appends the event `terminal` builds from the primary thread. A closed thread
   * starts no turn (`changeThread`) and ends no wait, so that event stays the Session's last
   * status event. `open`: not archived; `busy`: a turn is under way (its end settles the
   * Session); `closed`: written now or before; `gone`: no such Session, or its log was erased.
   */
  async closeSettled(sessionId: string, terminal: (primary: Readonly<ThreadDoc> | undefined) => AppendEvent): Promise<'open' | 'busy' | 'closed' | 'gone'> {
    const tag = sessionTag(sessionId);
    for (let attempt = 0; attempt < 8; attempt++) {
      const s = await this.docs.get<SessionDoc | SessionTombstone>(tag, sessionId);
      if (!s || s.type !== 'session') return 'gone';
      if (s.archived_at === null) return 'open';
      const { ids } = await this.threadIds(sessionId, -1, MAX_CLOSED_THREADS);
      const threads = (await this.threads(sessionId, ids)).filter((t) => t.type === 'session_thread' && t.session_id === sessionId);
      if (threads.length === 0) return 'gone';
      if (threads.every((t) => t._closed === true)) return 'closed';
      if (threads.some((t) => t.status === 'running' || t.status === 'rescheduling')) {
        // A turn under way: every thread is marked archived (a compare-and-swap each), so a
        // turn's end finds the archive in the very thread it writes, even when it was handed the
        // Session as it was before the archive, and closes the Session itself. A turn that ended
        // before its thread was marked did not see the mark: the threads are looked at again.
        for (const t of threads) {
          if (t._archived === true) continue;
          const marked = await this.docs.update<ThreadDoc>(tag, t.id, (cur) => (cur._archived === true || cur._closed === true ? null : { ...cur, _archived: true }), { current: t, notFound: 'thread' });
          this.rememberThread(marked);
        }
        const after = await this.threads(sessionId, ids);
        if (after.some((t) => t.status === 'running' || t.status === 'rescheduling')) return 'busy';
        continue;
      }
      const now = nowIso();
      const next = threads.map((t): ThreadDoc => ({ ...t, _closed: true, version: t.version + 1, updated_at: now }));
      const r = await this.log.commit(sessionId, next.map((t, i) => ({ key: keys.doc(tag, t.id), body: JSON.stringify(t), expectedVersion: (threads[i] as ThreadDoc).version })),
        [terminal(threads.find((t) => t.parent_thread_id === null))]);
      if (r.ok) {
        for (const t of next) this.rememberThread(t);
        return 'closed';
      }
      if (r.reason === 'erased') return 'gone';
      if (r.reason !== 'stale' && r.reason !== 'missing') throw new Error(`the terminal status of Session ${sessionId} could not be written: ${r.reason}`);
    }
    return 'busy';
  }

  /** A thread this process just wrote by other means (a write riding on another document's script): the next compare-and-swap's guess. */
  noteThreadWritten(t: ThreadDoc): void {
    this.rememberThread(t);
  }

  private rememberThread(t: ThreadDoc): void {
    this.recentThreads.set(`${t.session_id}/${t.id}`, { raw: JSON.stringify(t) });
  }

  async threadIds(sessionId: string, afterSpawn: number, limit: number): Promise<{ ids: string[]; scores: number[] }> {
    const raw = await this.redis.zrangebyscore(keys.index(sessionTag(sessionId), 'threads'), `(${afterSpawn}`, '+inf', 'WITHSCORES', 'LIMIT', 0, limit);
    const ids: string[] = [];
    const scores: number[] = [];
    for (let i = 0; i + 1 < raw.length; i += 2) {
      ids.push(raw[i] as string);
      scores.push(Number(raw[i + 1]));
    }
    return { ids, scores };
  }

  async threads(sessionId: string, ids: string[]): Promise<ThreadDoc[]> {
    return this.docs.getMany<ThreadDoc>(sessionTag(sessionId), ids);
  }

  /** Child threads are spawned by the runtime (a coordinator's roster), never by API callers. */
  async spawnChild(session: SessionDoc, agent: AgentSnapshot = session.agent): Promise<ThreadDoc> {
    const tag = sessionTag(session.id);
    const spawn = await this.redis.incr(keys.scoped(tag, 'spawn'));
    return this.createChild(session, agent, spawn);
  }

  /** Reserves a spawn number below `limit`, or null when the Session spawned `limit` children already. */
  async reserveSpawn(sessionId: string, limit: number): Promise<number | null> {
    const key = keys.scoped(sessionTag(sessionId), 'spawn');
    const n = await this.redis.incr(key);
    if (n > limit) {
      await this.redis.decr(key);
      return null;
    }
    return n;
  }

  /**
   * A child thread with a spawn number from `reserveSpawn` (or `spawnChild`). `id`: the thread's
   * id when its maker derives it (a coordinator's start, from the tool use): a thread of that id
   * made already (an earlier attempt of the same start) is returned as it is, nothing written.
   */
  async createChild(session: SessionDoc, agent: AgentSnapshot, spawn: number, id?: string): Promise<ThreadDoc> {
    const tag = sessionTag(session.id);
    const t = newThreadDoc(session, agent, session._primary_thread_id);
    if (id !== undefined) t.id = id;
    t._spawn = spawn;
    const r = await CREATE_CHILD.run(this.redis, [eventLogKeys.meta(session.id), keys.doc(tag, t.id), keys.index(tag, 'threads'), keys.scoped(tag, 'spawn')], [JSON.stringify(t), spawn, t.id]);
    if (r === 0) throw new ApiError('validation.not_found', 'the session was deleted and its event log erased');
    if (r !== 1) {
      if (id !== undefined) return this.thread(session.id, id);
      throw new Error(`thread ${t.id} exists already`);
    }
    return t;
  }

  // ---- runs ------------------------------------------------------------------------------

  async run(sessionId: string, runId: string): Promise<RunDoc | null> {
    return this.docs.get<RunDoc>(sessionTag(sessionId), runId);
  }
}

export function newThreadDoc(session: Pick<SessionDoc, 'id' | 'workspace_id' | 'created_at'>, agent: AgentSnapshot, parent: string | null): ThreadDoc {
  const now = nowIso();
  return {
    id: newId('thread'), type: 'session_thread', session_id: session.id, workspace_id: session.workspace_id, agent,
    parent_thread_id: parent, status: 'idle', archived_at: null, _spawn: 0, _active_run_id: null,
    _wait_generation: 0, _waits: {}, _running_since_ms: null, _running_ms_total: 0, _startup_ms: null, _frozen_stats: null,
    _stop_reason: null, version: 1, created_at: now, updated_at: now,
  };
}

/** The Run of a turn start: a child thread runs its own frozen member snapshot; the primary follows the Session's agent. */
function turnRun(session: SessionDoc, thread: Readonly<ThreadDoc>, start: TurnStart): RunDoc {
  return newRunDoc(thread.parent_thread_id === null ? session : { ...session, agent: thread.agent }, thread.id, start);
}

/** A turn start's writes in the Session's slot: the thread's compare-and-swap, the new Run (listed in `runs`) and `session.status_running`. */
function turnStartWrites(thread: ThreadDoc, expected: number, run: RunDoc): { docs: CommitDoc[]; running: AppendEvent } {
  const tag = sessionTag(run.session_id);
  return {
    docs: [
      { key: keys.doc(tag, thread.id), body: JSON.stringify(thread), expectedVersion: expected },
      { key: keys.doc(tag, run.id), body: JSON.stringify(run), expectedVersion: null, index: { key: keys.index(tag, 'runs'), score: Date.parse(run.created_at), member: run.id } },
    ],
    // The messages the turn takes (sent earlier, maybe while another turn ran): a conversation
    // rebuilt from the log puts them here, where their turn starts (runs/history.ts).
    running: {
      type: 'session.status_running',
      payload: run.input_event_ids && run.input_event_ids.length > 0 ? { run_id: run.id, input_event_ids: run.input_event_ids } : { run_id: run.id },
      session_thread_id: thread.id, producer_key: `status:${run.id}:running`,
    },
  };
}

export function newRunDoc(session: Pick<SessionDoc, 'id' | 'workspace_id' | 'agent' | 'environment_id' | 'environment_version' | 'agent_deployment'>, threadId: string, start: TurnStart): RunDoc {
  const now = nowIso();
  return {
    id: start.runId, type: 'run', session_id: session.id, workspace_id: session.workspace_id, session_thread_id: threadId,
    status: 'queued', agent: session.agent, environment_id: session.environment_id, environment_version: session.environment_version,
    input_event_ids: start.inputs, version: 1, created_at: now, updated_at: now,
    ...(start.continuesRunId !== undefined ? { continues_run_id: start.continuesRunId } : {}),
    ...(start.grader ? { grader: start.grader } : {}),
    ...(session.agent_deployment ? { agent_deployment: session.agent_deployment } : {}),
  };
}
