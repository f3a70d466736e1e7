import type { Logger } from '@agentplane/core';
import { eventLogKeys, tags, type DocumentStore, type EventLog, type LiveMessage, type LogEvent, type Redis } from '@agentplane/store';

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

interface SessionFacts { workspace_id: string; automation_id: string | null; firing_id: string | null; agent_id: string | null }

/**
 * One pattern subscription per api process to every Session log's live channel
 * (`ap:{s:*}:live`), shared by the webhook deliveries and the subscription triggers. Pub/sub is
 * not durable: listeners that need every event keep their own cursor and sweep the log.
 */
export class SessionEventTap {
  private conn: Redis | null = null;
  private readonly listeners: { wants: (ws: string) => Promise<boolean>; fn: AppendListener }[] = [];
  private readonly facts = new Map<string, SessionFacts | null>();

  constructor(private readonly d: { redis: Redis; docs: DocumentStore; log: EventLog; logger: Logger }) {}

  /** `wants` is asked first (cheaply) whether the Workspace matters to the listener at all. */
  on(wants: (ws: string) => Promise<boolean>, fn: AppendListener): void {
    this.listeners.push({ wants, fn });
  }

  private async factsOf(sessionId: string): Promise<SessionFacts | null> {
    const known = this.facts.get(sessionId);
    if (known !== undefined) return known;
    const doc = await this.d.docs.get<{
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
   * The Session's facts and the listeners' interest come first: a message is parsed only when a
   * listener wants its Workspace (most appends, in most Workspaces, interest none).
   */
  private async dispatch(sessionId: string, message: string): Promise<void> {
    if (this.listeners.length === 0) return;
    const f = await this.factsOf(sessionId);
    if (!f) return;
    const wanted: AppendListener[] = [];
    for (const l of this.listeners) if (await l.wants(f.workspace_id)) wanted.push(l.fn);
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
    if (this.conn) return;
    const conn = this.d.redis.duplicate({ connectionName: 'agentplane:api:event-tap', maxRetriesPerRequest: null });
    conn.on('error', (err: Error) => this.d.logger.warn({ err: err.message }, 'event tap connection error'));
    void conn.psubscribe(eventLogKeys.liveChannel('*'));
    conn.on('pmessage', (_p: string, channel: string, message: string) => {
      const m = /\{s:(sess_[0-9a-f]{32})\}/.exec(channel);
      if (!m?.[1]) return;
      this.dispatch(m[1], message).catch((err: unknown) => this.d.logger.warn({ err }, 'event tap failed on an append'));
    });
    this.conn = conn;
  }

  async close(): Promise<void> {
    await this.conn?.quit().catch(() => this.conn?.disconnect());
  }
}
