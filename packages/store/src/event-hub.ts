import type { Redis } from 'ioredis';
import { eventLogKeys, type DeltaMessage, type LiveMessage } from './event-log.js';

/** What a viewer receives: committed appends, erasure, previews, or "you may have missed something". */
export type HubMessage = LiveMessage | { kind: 'delta'; delta: DeltaMessage } | { kind: 'resync' };

export type HubListener = (msg: HubMessage) => void;

export interface HubWatch {
  /** Stop receiving; the channel is unsubscribed when its last viewer leaves. */
  close(): void;
}

interface ChannelEntry {
  listeners: Set<HubListener>;
  ready: Promise<void>;
}

/** Channels left by their last viewer are unsubscribed together, at most this long after. */
const UNSUBSCRIBE_EVERY_MS = 100;

/**
 * The per-process fan-out of live session events: ONE subscriber connection for the whole
 * process, channel subscriptions ref-counted by viewers. A thousand SSE viewers on a thousand
 * sessions cost one Redis connection and one SUBSCRIBE per watched session, never a blocking
 * read per stream. Each message is parsed once and handed to every viewer of its channel.
 *
 * A channel whose last viewer left stays subscribed until the next batch of unsubscriptions
 * (`UNSUBSCRIBE_EVERY_MS`): one UNSUBSCRIBE names every channel left meanwhile, instead of one
 * command per closed stream, and a viewer that comes back in the meantime finds the channel
 * still subscribed.
 *
 * After the subscriber reconnects, every viewer gets `{kind: 'resync'}`: messages published
 * while it was away are lost, so viewers re-read the log from their last delivered seq.
 */
export class EventHub {
  private readonly channels = new Map<string, ChannelEntry>();
  /** Subscribed channels with no viewer left, to unsubscribe in the next batch. */
  private readonly leaving = new Set<string>();
  private leaveTimer: NodeJS.Timeout | undefined;
  private closed = false;
  private everReady = false;

  constructor(private readonly sub: Redis) {
    sub.on('message', (channel: string, text: string) => this.dispatch(channel, text));
    sub.on('ready', () => {
      if (!this.everReady) {
        this.everReady = true;
        return;
      }
      // Re-subscribe explicitly and wait for the confirmation (replies come in order, so the
      // client's own automatic re-subscription is confirmed too) before viewers re-read the log:
      // anything appended after that point arrives live.
      const channels = [...this.channels.keys()];
      const resubscribed = channels.length > 0 ? this.sub.subscribe(...channels) : Promise.resolve(0);
      resubscribed.then(
        () => {
          for (const c of channels) for (const l of this.channels.get(c)?.listeners ?? []) l({ kind: 'resync' });
        },
        () => undefined,
      );
    });
  }

  /** Number of channels some viewer of this process watches (metrics, tests). */
  get channelCount(): number {
    return this.channels.size - this.leaving.size;
  }

  /**
   * Start receiving a session's live appends (and previews when `deltas`). Resolves once the
   * subscription is confirmed by Redis: anything appended after that point reaches `listener`,
   * so a reader that subscribes first and reads the log second can never miss an event.
   */
  async watch(sessionId: string, listener: HubListener, options: { deltas?: boolean } = {}): Promise<HubWatch> {
    if (this.closed) throw new Error('the event hub is closed');
    const channels = [eventLogKeys.liveChannel(sessionId)];
    if (options.deltas) channels.push(eventLogKeys.deltaChannel(sessionId));
    await Promise.all(channels.map((c) => this.add(c, listener)));
    let done = false;
    return {
      close: () => {
        if (done) return;
        done = true;
        for (const c of channels) this.remove(c, listener);
      },
    };
  }

  private add(channel: string, listener: HubListener): Promise<void> {
    let entry = this.channels.get(channel);
    if (!entry) {
      entry = { listeners: new Set(), ready: this.sub.subscribe(channel).then(() => undefined) };
      this.channels.set(channel, entry);
    }
    this.leaving.delete(channel);
    entry.listeners.add(listener);
    return entry.ready;
  }

  private remove(channel: string, listener: HubListener): void {
    const entry = this.channels.get(channel);
    if (!entry) return;
    entry.listeners.delete(listener);
    if (entry.listeners.size > 0 || this.closed) return;
    this.leaving.add(channel);
    if (this.leaveTimer === undefined) {
      this.leaveTimer = setTimeout(() => this.leave(), UNSUBSCRIBE_EVERY_MS);
      this.leaveTimer.unref();
    }
  }

  /** Unsubscribe, in one command, every channel still without a viewer. */
  private leave(): void {
    this.leaveTimer = undefined;
    const gone = [...this.leaving];
    this.leaving.clear();
    for (const c of gone) this.channels.delete(c);
    // Commands on one connection run in order: a later SUBSCRIBE of the same channel wins.
    if (gone.length > 0 && !this.closed) this.sub.unsubscribe(...gone).catch(() => undefined);
  }

  private dispatch(channel: string, text: string): void {
    const entry = this.channels.get(channel);
    if (!entry || entry.listeners.size === 0) return;
    let msg: HubMessage;
    try {
      msg = channel.endsWith(':deltas') ? { kind: 'delta', delta: JSON.parse(text) as DeltaMessage } : (JSON.parse(text) as LiveMessage);
    } catch {
      return;
    }
    for (const l of [...entry.listeners]) l(msg);
  }

  async close(): Promise<void> {
    this.closed = true;
    clearTimeout(this.leaveTimer);
    this.leaving.clear();
    this.channels.clear();
    await this.sub.quit().catch(() => this.sub.disconnect());
  }
}
