import { describe, expect, it } from 'vitest';
import { createLogger } from '@agentplane/core';
import type { DocumentStore, EventHub, EventLog, LogEvent } from '@agentplane/store';
import { SessionEventTap, type TappedAppend } from './tap.js';

const SESSION = `sess_${'a'.repeat(32)}`;
const event = (seq: number, type: string, payload: unknown = {}): LogEvent =>
  ({ id: `evt_${String(seq).padStart(32, '0')}`, seq, created_at: '2026-11-25T00:00:00.000Z', session_id: SESSION, session_thread_id: null, type, payload }) as LogEvent;
const inline = (events: LogEvent[]) => JSON.stringify({ kind: 'events', from: events[0]?.seq, to: events.at(-1)?.seq, events });

/** A tap over stubs that count the reads it makes (no Redis: the subscription is not started). */
function tapWith(facts: Record<string, unknown> | null, stored: LogEvent[] = []) {
  const reads = { docs: 0, log: 0 };
  const docs = { getShared: async () => (reads.docs++, facts) } as unknown as DocumentStore;
  const log = { range: async () => (reads.log++, stored) } as unknown as EventLog;
  const tap = new SessionEventTap({ hub: {} as EventHub, docs, log, logger: createLogger({ name: 'test', level: 'silent' }) });
  return { tap, reads };
}

describe('SessionEventTap', () => {
  const facts = { id: SESSION, workspace_id: 'wrkspc_1', metadata: { automation_firing_id: 'afir_1' } };

  it('hands an append only to listeners whose facts and event types it matches, reading the facts once', async () => {
    const { tap, reads } = tapWith(facts);
    const seen: Record<string, TappedAppend[]> = { all: [], ended: [], firing: [], none: [] };
    tap.on({ wants: () => true }, async (a) => void seen.all?.push(a));
    tap.on({ wants: () => true, types: ['session.outcome_ended'] }, async (a) => void seen.ended?.push(a));
    tap.on({ wants: async (f) => f.firing_id === 'afir_1', types: ['session.status_idle'] }, async (a) => void seen.firing?.push(a));
    tap.on({ wants: () => false }, async (a) => void seen.none?.push(a));

    await tap.receive(SESSION, inline([event(1, 'user.message', { content: 'a "type":"session.outcome_ended" in text' })]));
    await tap.receive(SESSION, inline([event(2, 'agent.message'), event(3, 'session.status_idle', { stop_reason: { type: 'end_turn' } })]));
    await tap.receive(SESSION, inline([event(4, 'session.outcome_ended')]));
    expect(seen.all?.map((a) => a.from)).toEqual([1, 2, 4]);
    expect(seen.ended?.map((a) => a.from)).toEqual([4]);
    expect(seen.firing?.map((a) => a.from)).toEqual([2]);
    expect(seen.none).toEqual([]);
    expect(reads.docs).toBe(1);
    // The events of an inline message come from the message itself.
    expect((await seen.firing?.[0]?.events())?.map((e) => e.type)).toEqual(['agent.message', 'session.status_idle']);
    expect(reads.log).toBe(0);
  });

  it('a message without its events (a large append) goes to typed listeners too, whose events are read from the log', async () => {
    const stored = [event(7, 'session.outcome_ended')];
    const { tap, reads } = tapWith(facts, stored);
    const seen: TappedAppend[] = [];
    tap.on({ wants: () => true, types: ['session.outcome_ended'] }, async (a) => void seen.push(a));
    await tap.receive(SESSION, JSON.stringify({ kind: 'events', from: 7, to: 7 }));
    expect(seen).toHaveLength(1);
    expect(await seen[0]?.events()).toEqual(stored);
    expect(reads.log).toBe(1);
  });

  it('nothing is parsed or handed over when no listener wants the append, or the Session is unknown', async () => {
    const { tap } = tapWith(facts);
    let called = 0;
    tap.on({ wants: () => true, types: ['session.status_idle'] }, async () => void called++);
    tap.on({ wants: (f) => f.firing_id === 'other' }, async () => void called++);
    await tap.receive(SESSION, inline([event(1, 'user.message')]));
    // Facts known: an append nobody wants is settled at once, unparsed (this text is not even JSON).
    expect(tap.receive(SESSION, '{"kind":"events","from":2,"to":2,"events":[{"type":"user.message"')).toBeUndefined();
    expect(called).toBe(0);
    const gone = tapWith(null);
    gone.tap.on({ wants: () => true }, async () => void called++);
    await gone.tap.receive(SESSION, inline([event(1, 'user.message')]));
    await gone.tap.receive(SESSION, inline([event(2, 'user.message')]));
    expect(called).toBe(0);
    expect(gone.reads.docs).toBe(1);
  });
});
