import type { Redis } from 'ioredis';
import { eventLogKeys, type DeltaMessage, type LiveMessage } from './event-log.js';
import { onSubscriberReplaced } from './subscriber.js';

/** What a viewer receives: committed appends, erasure, previews, or "you may have missed something". */
export type HubMessage = LiveMessage | { kind: 'delta'; delta: DeltaMessage } | { kind: 'resync' };

export type HubListener = (msg: HubMessage) => void;

/**
 * Hears every Session's live message as Redis delivered it (its channel and unparsed text): for
 * listeners that look at every append of every Session (the api's event tap), cheaply.
 */
export type FirehoseListener = (channel: string, text: string) => void;

export interface HubWatch {
  /** Stop receiving; a previews channel is unsubscribed when its last viewer leaves. */
  close(): void;
}

interface DeltaEntry {
  listeners: Set<HubListener>;
  ready: Promise<void>;
}

/** Previews channels left by their last viewer are unsubscribed together, at most this long after. */
const UNSUBSCRIBE_EVERY_MS = 100;

/** Every Session log's live channel (`ap:{s:<sess>}:live`), as one pattern. */
const LIVE_PATTERN = eventLogKeys.liveChannel('*');

/**
 * The per-process fan-out of live session events: ONE subscriber connection for the whole
 * process, holding ONE pattern subscription to every Session log's live channel. Every append
 * of every Session reaches the process once, on that connection: viewers of its Session get it
 * parsed once and shared; the firehose listeners (the api's event tap: webhooks, subscription
 * triggers) get its text; an append nobody watches costs a map lookup. A stream therefore
 * subscribes to nothing when it opens (no SUBSCRIBE before its replay, no UNSUBSCRIBE when it
 * leaves), and no append is delivered to the process twice.
 *
 * Previews (`ap:{s:<sess>}:deltas`, far more numerous, wanted only by streams opened with
 * `event_deltas`) keep a channel subscription per watched Session, ref-counted by its viewers;
 * a channel whose last viewer left stays subscribed until the next batch of unsubscriptions
 * (`UNSUBSCRIBE_EVERY_MS`): one UNSUBSCRIBE names every channel left meanwhile, and a viewer
 * that comes back in the meantime finds the channel still subscribed.
 *
 * After the subscriber reconnects, every viewer gets `{kind: 'resync'}`: messages published
 * while it was away are lost, so viewers re-read the log from their last delivered seq.
 */
export class EventHub {
  /** Viewers of each Session's live channel, by channel. */
  private readonly live = new Map<string, Set<HubListener>>();
  private readonly deltas = new Map<string, DeltaEntry>();
  /** Subscribed previews channels with no viewer left, to unsubscribe in the next batch. */
  private readonly leaving = new Set<string>();
  private readonly firehose: FirehoseListener[] = [];
  private leaveTimer: NodeJS.Timeout | undefined;
  private closed = false;
  /** The pattern subscription, confirmed (a watch waits for it before its caller reads the log). */
  private patternReady: Promise<void>;

  constructor(private readonly sub: Redis) {
    sub.on('pmessage', (_pattern: string, channel: string, text: string) => this.dispatchLive(channel, text));
    sub.on('message', (channel: string, text: string) => this.dispatchDelta(channel, text));
    this.patternReady = this.subscribePattern();
    // After a reconnect (or, on a cluster, a move to another node) messages were lost meanwhile.
    onSubscriberReplaced(sub, () => this.resubscribe());
  }

  /**
   * Re-subscribe explicitly and wait for the confirmation (replies come in order, so the client's
   * own automatic re-subscription is confirmed too) before viewers re-read the log: anything
   * appended after that point arrives live.
   */
  private resubscribe(): void {
    if (this.closed) return;
    this.patternReady = this.subscribePattern();
    const channels = [...this.deltas.keys()];
    Promise.all([this.patternReady, channels.length > 0 ? this.sub.subscribe(...channels) : 0]).then(
      () => {
        const viewers = new Set<HubListener>();
        for (const set of this.live.values()) for (const l of set) viewers.add(l);
        for (const c of channels) for (const l of this.deltas.get(c)?.listeners ?? []) viewers.add(l);
        for (const l of viewers) l({ kind: 'resync' });
      },
      () => undefined,
    );
  }

  private subscribePattern(): Promise<void> {
    const confirmed = this.sub.psubscribe(LIVE_PATTERN).then(() => undefined);
    // A watch made while it is pending rejects with it; nobody else waits on it.
    confirmed.catch(() => undefined);
    return confirmed;
  }

  /** Number of channels (live and previews) some viewer of this process watches (metrics, tests). */
  get channelCount(): number {
    return this.live.size + this.deltas.size - this.leaving.size;
  }

  /** Hear every Session's live message (see `FirehoseListener`). */
  onEveryLive(listener: FirehoseListener): void {
    this.firehose.push(listener);
  }

  /**
   * Start receiving a session's live appends (and previews when `deltas`). Resolves once the
   * subscriptions are confirmed by Redis: anything appended after that point reaches `listener`,
   * so a reader that watches first and reads the log second can never miss an event.
   */
  async watch(sessionId: string, listener: HubListener, options: { deltas?: boolean } = {}): Promise<HubWatch> {
    if (this.closed) throw new Error('the event hub is closed');
    const liveChannel = eventLogKeys.liveChannel(sessionId);
    let viewers = this.live.get(liveChannel);
    if (!viewers) this.live.set(liveChannel, (viewers = new Set()));
    viewers.add(listener);
    const deltaChannel = options.deltas ? eventLogKeys.deltaChannel(sessionId) : undefined;
    let done = false;
    const watch: HubWatch = {
      close: () => {
        if (done) return;
        done = true;
        const set = this.live.get(liveChannel);
        set?.delete(listener);
        if (set?.size === 0) this.live.delete(liveChannel);
        if (deltaChannel) this.removeDelta(deltaChannel, listener);
      },
    };
    try {
      await Promise.all([this.patternReady, deltaChannel ? this.addDelta(deltaChannel, listener) : undefined]);
    } catch (err) {
      watch.close();
      throw err;
    }
    return watch;
  }

  private addDelta(channel: string, listener: HubListener): Promise<void> {
    let entry = this.deltas.get(channel);
    if (!entry) {
      entry = { listeners: new Set(), ready: this.sub.subscribe(channel).then(() => undefined) };
      this.deltas.set(channel, entry);
    }
    this.leaving.delete(channel);
    entry.listeners.add(listener);
    return entry.ready;
  }

  private removeDelta(channel: string, listener: HubListener): void {
    const entry = this.deltas.get(channel);
    if (!entry) return;
    entry.listeners.delete(listener);
    if (entry.listeners.size > 0 || this.closed) return;
    this.leaving.add(channel);
    if (this.leaveTimer === undefined) {
      this.leaveTimer = setTimeout(() => this.leave(), UNSUBSCRIBE_EVERY_MS);
      this.leaveTimer.unref();
    }
  }

  /** Unsubscribe, in one command, every previews channel still without a viewer. */
  private leave(): void {
    this.leaveTimer = undefined;
    const gone = [...this.leaving];
    this.leaving.clear();
    for (const c of gone) this.deltas.delete(c);
    // Commands on one connection run in order: a later SUBSCRIBE of the same channel wins.
    if (gone.length > 0 && !this.closed) this.sub.unsubscribe(...gone).catch(() => undefined);
  }

  private dispatchLive(channel: string, text: string): void {
    for (const f of this.firehose) {
      try {
        f(channel, text);
      } catch {
        // A firehose listener reports its own failures; the viewers still get the message.
      }
    }
    const viewers = this.live.get(channel);
    if (!viewers || viewers.size === 0) return;
    let msg: LiveMessage;
    try {
      msg = JSON.parse(text) as LiveMessage;
    } catch {
      return;
    }
    for (const l of [...viewers]) l(msg);
  }

  private dispatchDelta(channel: string, text: string): void {
    const entry = this.deltas.get(channel);
    if (!entry || entry.listeners.size === 0) return;
    let delta: DeltaMessage;
    try {
      delta = JSON.parse(text) as DeltaMessage;
    } catch {
      return;
    }
    const msg: HubMessage = { kind: 'delta', delta };
    for (const l of [...entry.listeners]) l(msg);
  }

  async close(): Promise<void> {
    this.closed = true;
    clearTimeout(this.leaveTimer);
    this.leaving.clear();
    this.live.clear();
    this.deltas.clear();
    await this.sub.quit().catch(() => this.sub.disconnect());
  }
}
