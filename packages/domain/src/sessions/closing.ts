import type { AppendEvent, Redis } from '@agentplane/store';
import { Outbox } from '../outbox.js';
import type { SessionDoc, ThreadDoc } from './model.js';
import { sessionTag, type SessionStore } from './store.js';

type TerminalType = 'session.status_completed' | 'session.status_canceled' | 'session.status_failed';

/**
 * Which terminal status event closes a Session, from its primary thread as the close finds it:
 * `session.status_completed` when its last turn ended `end_turn` (or it never ran one),
 * `session.status_canceled` when it was interrupted or waits on an action that can no longer
 * come (an archived Session takes no drive events), `session.status_failed` for any other stop
 * (`retries_exhausted`, `budget_exceeded`, `max_duration`, …) and for a terminated thread.
 */
export function terminalEvent(primary: Readonly<ThreadDoc> | undefined): AppendEvent {
  const stop = primary?._stop_reason ?? null;
  const kind = typeof stop === 'object' && stop !== null && typeof (stop as { type?: unknown }).type === 'string' ? (stop as { type: string }).type : null;
  let type: TerminalType = 'session.status_failed';
  if (primary?.status !== 'terminated') {
    if (kind === null || kind === 'end_turn') type = 'session.status_completed';
    else if (kind === 'interrupted' || kind === 'requires_action') type = 'session.status_canceled';
  }
  return { type, payload: { stop_reason: stop }, session_thread_id: null, producer_key: 'session:terminal' };
}

/**
 * Writes an archived Session's terminal status event once its last turn is over
 * (`SessionStore.closeSettled`). The archive writes the Session down here first (before the
 * archive itself), and the entry goes once the event is written: a process that dies between
 * the archive, or a turn's end, and the close leaves the entry, and the scheduler's sweep
 * (`repair`) closes the Session. A Session whose turn is still under way keeps its entry: its
 * turn's end closes it, and the sweep looks again until then.
 *
 * `ap:{g:close_outbox:<n>}:close_outbox:<n>`: zset, member: the Session id, score: ms.
 */
export class SessionCloser {
  private readonly outbox: Outbox;
  private beforeSweptClose: ((session: SessionDoc) => Promise<void>) | undefined;

  constructor(private readonly store: SessionStore, redis: Redis) {
    this.outbox = new Outbox(redis, 'close_outbox');
  }

  /**
   * What an archive does between its own write and the close, done again by the sweep for a
   * Session whose archive died in between (the outcomes module: an outcome waiting on an answer
   * ends). It must be retry-safe; a Session whose hook fails stays for the next sweep.
   */
  beforeRepair(hook: (session: SessionDoc) => Promise<void>): void {
    this.beforeSweptClose = hook;
  }

  /** Before the archive's own write: the sweep finds the Session if nothing after it happens. */
  archiving(sessionId: string): Promise<void> {
    return this.outbox.add(sessionId, sessionId);
  }

  /** Writes the terminal status event if the Session is archived and no turn is under way. */
  async settle(sessionId: string): Promise<'open' | 'busy' | 'closed' | 'gone'> {
    const r = await this.store.closeSettled(sessionId, terminalEvent);
    if (r !== 'busy') await this.outbox.remove(sessionId, sessionId);
    return r;
  }

  /** Sessions archived more than `olderThanMs` ago and not closed yet: settled now. Returns those closed. */
  async repair(olderThanMs: number): Promise<string[]> {
    const closed: string[] = [];
    for (const { member } of await this.outbox.due(olderThanMs)) {
      if (this.beforeSweptClose) {
        const session = await this.store.docs.get<SessionDoc>(sessionTag(member), member);
        if (session?.type === 'session' && session.archived_at !== null && !(await this.beforeSweptClose(session).then(() => true, () => false))) continue;
      }
      if ((await this.settle(member)) === 'closed') closed.push(member);
    }
    return closed;
  }
}
