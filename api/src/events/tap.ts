import type { Logger } from '@agentplane/core';
import { tags, type DocumentStore, type EventHub, type EventLog, type LiveMessage, type LogEvent } from '@agentplane/store';

/** What a listener learns about one committed append. */
export interface TappedAppend {
  session_id: string;
  workspace_id: string;
  automation_id: string | null;
  /** The firing that created the Session (Sessions made by an Automation). */
  firing_id: string | null;
  agent_id: string | null;
  from: number;
  to: number;
  /** The appended events (read from the log when the message did not carry them inline). */
  events(): Promise<LogEvent[]>;
}

export type AppendListener = (a: TappedAppend) => Promise<void>;

/** What the tap knows of a Session without reading its log. */
export interface SessionFacts { workspace_id: string; automation_id: string | null; firing_id: string | null; agent_id: string | null }

/** Which appends a listener is handed. */
export interface TapInterest {
  /** Asked first, from the Session's facts alone (cheaply, often without a promise). */
  wants: (facts: SessionFacts) => boolean | Promise<boolean>;
  /**
   * Only appends that may hold an event of one of these types (default: every append). An append
   * whose live message carries its events is tested on the message's text, before any parse; one
   * that does not (a large append) is always handed over.
   */
  types?: readonly string[];
}

interface Listener { wants: TapInterest['wants']; needles: string[] | null; fn: AppendListener }

/**
 * Every Session log's live message this api process hears, from the process's event hub (its
 * one pattern subscription to `ap:{s:*}:live`, which also feeds the SSE streams), shared by the
 * webhook deliveries and the subscription triggers. Pub/sub is not durable: listeners that need
 * every event keep their own cursor and sweep the log.
 *
 * Every append of every Session reaches every api process here, so an append nobody wants costs
 * a map lookup and a few substring tests: no parse, no read, no promise.
 */
export class SessionEventTap {
  private started = false;
  private closed = false;
  private readonly listeners: Listener[] = [];
  private readonly facts = new Map<string, SessionFacts | null>();

  constructor(private readonly d: { hub: EventHub; docs: DocumentStore; log: EventLog; logger: Logger }) {}

  on(interest: TapInterest, fn: AppendListener): void {
    // An event's own type is written as `"type":"<type>"` in its JSON (a string value's quotes are escaped).
    this.listeners.push({ wants: interest.wants, needles: interest.types ? interest.types.map((t) => `"type":${JSON.stringify(t)}`) : null, fn });
  }

  /**
   * A Session's facts never change once it exists: read through the process's read cache (a
   * Session this process serves, or whose stream it holds, is usually there already, so hearing
   * its first append costs no read).
   */
  private async readFacts(sessionId: string): Promise<SessionFacts | null> {
    const doc = await this.d.docs.getShared<{
      id: string; version: number; created_at: string; updated_at: string; workspace_id: string; automation_id?: string; agent?: { id?: string }; metadata?: Record<string, string>;
    }>(tags.session(sessionId), sessionId);
    const f = doc
      ? { workspace_id: doc.workspace_id, automation_id: doc.automation_id ?? null, firing_id: doc.metadata?.automation_firing_id ?? null, agent_id: doc.agent?.id ?? null }
      : null;
    if (this.facts.size > 50_000) this.facts.clear();
    this.facts.set(sessionId, f);
    return f;
  }

  /**
   * One live message of a Session's log (what the subscription hands over). The Session's facts,
   * the listeners' interest and the message's text come first: a message is parsed only when a
   * listener wants it (most appends, in most Workspaces, interest none).
   */
  receive(sessionId: string, message: string): Promise<void> | undefined {
    if (this.listeners.length === 0) return undefined;
    const known = this.facts.get(sessionId);
    if (known === null) return undefined;
    if (known === undefined) return this.readFacts(sessionId).then((f) => (f ? this.hand(sessionId, message, f) : undefined));
    return this.hand(sessionId, message, known);
  }

  private hand(sessionId: string, message: string, f: SessionFacts): Promise<void> | undefined {
    const inline = message.includes(',"events":[');
    let asked: { l: Listener; wants: boolean | Promise<boolean> }[] | undefined;
    for (const l of this.listeners) {
      if (inline && l.needles && !l.needles.some((n) => message.includes(n))) continue;
      const wants = l.wants(f);
      if (wants === false) continue;
      (asked ??= []).push({ l, wants });
    }
    return asked ? this.deliver(sessionId, message, f, asked) : undefined;
  }

  private async deliver(sessionId: string, message: string, f: SessionFacts, asked: { l: Listener; wants: boolean | Promise<boolean> }[]): Promise<void> {
    const wanted: AppendListener[] = [];
    for (const a of asked) if (await a.wants) wanted.push(a.l.fn);
    if (wanted.length === 0) return;
    let msg: LiveMessage;
    try {
      msg = JSON.parse(message) as LiveMessage;
    } catch {
      return;
    }
    if (msg.kind !== 'events') return;
    let cached: LogEvent[] | null = msg.events ?? null;
    const append: TappedAppend = {
      session_id: sessionId, ...f, from: msg.from, to: msg.to,
      events: async () => (cached ??= await this.d.log.range(sessionId, msg.from - 1, msg.to - msg.from + 1, msg.to)),
    };
    for (const fn of wanted) await fn(append).catch((err: unknown) => this.d.logger.warn({ err, session_id: sessionId }, 'an event-tap listener failed'));
  }

  start(): void {
    if (this.started) return;
    this.started = true;
    this.d.hub.onEveryLive((channel, message) => {
      if (this.closed || this.listeners.length === 0) return;
      const m = /\{s:(sess_[0-9a-f]{32})\}/.exec(channel);
      if (!m?.[1]) return;
      const failed = (err: unknown) => this.d.logger.warn({ err }, 'event tap failed on an append');
      try {
        this.receive(m[1], message)?.catch(failed);
      } catch (err) {
        failed(err);
      }
    });
  }

  /** Stop handing appends to the listeners (the hub's connection is closed with the hub). */
  async close(): Promise<void> {
    this.closed = true;
  }
}
