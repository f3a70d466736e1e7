import { describe, expect, it } from 'vitest';
import type { LogEvent } from '@agentplane/store';
import { authoringStepId, readTranscript, renderTranscript, TRANSCRIPT_LIMIT_CHARS } from './authoring.js';

describe('the authoring model step id', () => {
  const job = { timestamp: 1_760_000_000_000, attemptsMade: 0 };

  it('is the same for a replay of one attempt (charged once) and new for each retry (charged again)', () => {
    const first = authoringStepId('skp_1', job);
    expect(authoringStepId('skp_1', { ...job })).toBe(first);
    const retry = authoringStepId('skp_1', { ...job, attemptsMade: 1 });
    expect(retry).not.toBe(first);
    expect(authoringStepId('skp_1', { ...job, attemptsMade: 2 })).not.toBe(retry);
  });

  it('differs between proposals and between jobs of one proposal', () => {
    expect(authoringStepId('skp_2', job)).not.toBe(authoringStepId('skp_1', job));
    expect(authoringStepId('skp_1', { ...job, timestamp: job.timestamp + 1 })).not.toBe(authoringStepId('skp_1', job));
  });
});

describe('reading a source Session\'s transcript', () => {
  /** A log of `count` agent messages of `chars` characters each, counting the events it hands out. */
  function fakeLog(count: number, chars: number) {
    const read = { events: 0, calls: 0 };
    const event = (seq: number): LogEvent => ({
      id: `sevt_${seq}`, seq, created_at: '2026-01-01T00:00:00.000Z', session_id: 'sess_1', session_thread_id: null,
      type: seq % 2 === 0 ? 'agent.message' : 'session.status_running', payload: { content: 'x'.repeat(chars) },
    });
    const log = {
      range: (_sessionId: string, afterSeq: number, limit: number): Promise<LogEvent[]> => {
        read.calls++;
        const page: LogEvent[] = [];
        for (let seq = afterSeq + 1; seq <= count && page.length < limit; seq++) page.push(event(seq));
        read.events += page.length;
        return Promise.resolve(page);
      },
    };
    return { log, read, all: () => Array.from({ length: count }, (_, i) => event(i + 1)) };
  }

  it('is the rendered transcript of the whole log when it fits', async () => {
    const { log, all } = fakeLog(450, 100);
    const text = await readTranscript(log, 'sess_1', TRANSCRIPT_LIMIT_CHARS);
    expect(text).toBe(renderTranscript('sess_1', all()));
  });

  it('stops reading as soon as the transcript passes its budget: a huge log is never read whole', async () => {
    // 200,000 events, 100,000 of them 1 KiB messages: about 100 MiB of transcript.
    const { log, read } = fakeLog(200_000, 1024);
    expect(await readTranscript(log, 'sess_1', TRANSCRIPT_LIMIT_CHARS)).toBeNull();
    // The 256 Ki character budget holds about 255 such messages: 510 events, read 100 at a time.
    expect(read.events).toBeLessThanOrEqual(600);
    expect(read.calls).toBeLessThanOrEqual(6);
  });

  it('is null for a transcript just past the budget and whole for one at it', async () => {
    const { log, all } = fakeLog(20, 50);
    const size = renderTranscript('sess_1', all()).length;
    expect(await readTranscript(log, 'sess_1', size)).toBe(renderTranscript('sess_1', all()));
    expect(await readTranscript(log, 'sess_1', size - 1)).toBeNull();
  });
});
