import { describe, expect, it } from 'vitest';
import { ApiError } from '@agentplane/core';
import { checkCron, cronRepeatStrategy, nextCronMillis, runsEveryHour } from './cron.js';

/**
 * Cron times in a time zone across daylight saving changes: every fire a Job Scheduler makes
 * between two instants, each next time computed from the previous one (or from when the tick was
 * taken, when it ran late), as BullMQ does with the repeat strategy.
 */
function fires(pattern: string, tz: string, fromIso: string, toIso: string, takenAt = (due: number) => due): number[] {
  const out: number[] = [];
  let t = Date.parse(fromIso);
  for (;;) {
    const n = nextCronMillis(t, pattern, tz);
    if (n === undefined || n > Date.parse(toIso)) return out;
    out.push(n);
    t = takenAt(n);
  }
}
const local = (ts: number[], tz: string) => ts.map((t) => new Date(t).toLocaleString('sv-SE', { timeZone: tz }));
const iso = (ts: number[]) => ts.map((t) => new Date(t).toISOString());

describe('a daily cron time the clock skips', () => {
  it('fires once, as the clock jumps, also when the change is at midnight (America/Santiago, Africa/Cairo)', () => {
    // Santiago turns 00:00 into 01:00 on 2026-09-06: that day's midnight fire comes at 01:00.
    expect(local(fires('0 0 * * *', 'America/Santiago', '2026-09-04T12:00:00Z', '2026-09-08T12:00:00Z'), 'America/Santiago'))
      .toEqual(['2026-09-05 00:00:00', '2026-09-06 01:00:00', '2026-09-07 00:00:00', '2026-09-08 00:00:00']);
    expect(local(fires('30 0 * * *', 'Africa/Cairo', '2026-04-22T12:00:00Z', '2026-04-26T12:00:00Z'), 'Africa/Cairo'))
      .toEqual(['2026-04-23 00:30:00', '2026-04-24 01:00:00', '2026-04-25 00:30:00', '2026-04-26 00:30:00']);
  });

  it('fires once, as the clock jumps, for a change of 30 minutes (Australia/Lord_Howe) and of an hour (Europe/Paris, America/New_York)', () => {
    expect(local(fires('15 2 * * *', 'Australia/Lord_Howe', '2026-10-02T12:00:00Z', '2026-10-05T12:00:00Z'), 'Australia/Lord_Howe'))
      .toEqual(['2026-10-03 02:15:00', '2026-10-04 02:30:00', '2026-10-05 02:15:00']);
    expect(local(fires('30 2 * * *', 'Europe/Paris', '2026-03-28T00:00:00Z', '2026-03-30T12:00:00Z'), 'Europe/Paris'))
      .toEqual(['2026-03-28 02:30:00', '2026-03-29 03:00:00', '2026-03-30 02:30:00']);
    // Every skipped time of one change makes one fire.
    expect(local(fires('*/10 2 * * *', 'America/New_York', '2026-03-08T00:00:00Z', '2026-03-08T23:00:00Z'), 'America/New_York')).toEqual(['2026-03-08 03:00:00']);
  });
});

describe('a daily cron time the clock repeats', () => {
  it('fires once, at its first showing, even when the tick before it ran late into the repeated hour', () => {
    const ny = '2026-11-01T05:30:00Z'; // 01:30 EDT; the clock shows 01:30 again (EST) an hour later
    expect(iso(fires('30 1 * * *', 'America/New_York', '2026-10-31T12:00:00Z', '2026-11-02T12:00:00Z'))).toEqual([ny, '2026-11-02T06:30:00.000Z'].map((t) => new Date(t).toISOString()));
    // Taken 40 minutes late (01:10 EST): the next fire is the next day's, not 01:30 EST.
    const late = fires('30 1 * * *', 'America/New_York', '2026-10-31T12:00:00Z', '2026-11-03T12:00:00Z', (due) => (due === Date.parse(ny) ? due + 40 * 60_000 : due));
    expect(local(late, 'America/New_York')).toEqual(['2026-11-01 01:30:00', '2026-11-02 01:30:00', '2026-11-03 01:30:00']);
    // A two-hour change (Antarctica/Troll turns 03:00 back to 01:00).
    expect(iso(fires('0 2 * * *', 'Antarctica/Troll', '2026-10-24T12:00:00Z', '2026-10-26T12:00:00Z'))).toEqual(['2026-10-25T00:00:00.000Z', '2026-10-26T02:00:00.000Z']);
  });
});

describe('an expression that runs every hour', () => {
  it('keeps its pace in real time across both changes', () => {
    const every15 = (from: string, to: string) => {
      const f = fires('*/15 * * * *', 'Europe/Paris', from, to);
      return f.slice(1).map((t, i) => t - f[i]!);
    };
    expect(new Set(every15('2026-03-28T22:00:00Z', '2026-03-29T04:00:00Z'))).toEqual(new Set([15 * 60_000]));
    expect(new Set(every15('2026-10-24T22:00:00Z', '2026-10-25T04:00:00Z'))).toEqual(new Set([15 * 60_000]));
    // The repeated 02:00 fires in both showings; the skipped one does not exist.
    expect(local(fires('0 * * * *', 'Europe/Paris', '2026-10-24T23:30:00Z', '2026-10-25T02:30:00Z'), 'Europe/Paris')).toEqual(['2026-10-25 02:00:00', '2026-10-25 02:00:00', '2026-10-25 03:00:00']);
    expect(local(fires('0 * * * *', 'Europe/Paris', '2026-03-28T23:30:00Z', '2026-03-29T02:30:00Z'), 'Europe/Paris')).toEqual(['2026-03-29 01:00:00', '2026-03-29 03:00:00', '2026-03-29 04:00:00']);
    expect([runsEveryHour('*/5 * * * *'), runsEveryHour('0 * * * * *'), runsEveryHour('@hourly'), runsEveryHour('0 */2 * * *'), runsEveryHour('@daily')]).toEqual([true, true, true, false, false]);
  });

  it('matches the zone-less times where no change is near, and in UTC', () => {
    expect(iso(fires('0 9 * * 1-5', 'Europe/Paris', '2026-06-05T00:00:00Z', '2026-06-09T00:00:00Z'))).toEqual(['2026-06-05T07:00:00.000Z', '2026-06-08T07:00:00.000Z']);
    expect(iso(fires('*/20 * * * * *', 'UTC', '2026-06-05T00:00:00Z', '2026-06-05T00:01:00Z'))).toEqual(['2026-06-05T00:00:20.000Z', '2026-06-05T00:00:40.000Z', '2026-06-05T00:01:00.000Z']);
    expect(new Date(nextCronMillis(Date.parse('2026-01-01T06:00:00Z'), '0 0 29 2 *', 'UTC')!).toISOString()).toBe('2028-02-29T00:00:00.000Z');
  });

  it('is the repeat strategy of the schedulers (a start date holds it back)', async () => {
    const at = Date.parse('2026-09-05T12:00:00Z');
    expect(await cronRepeatStrategy(at, { pattern: '0 0 * * *', tz: 'America/Santiago' })).toBe(Date.parse('2026-09-06T04:00:00Z'));
    expect(await cronRepeatStrategy(at, { pattern: '0 0 * * *', tz: 'America/Santiago', startDate: Date.parse('2026-09-06T12:00:00Z') })).toBe(Date.parse('2026-09-07T03:00:00Z'));
    expect(await cronRepeatStrategy(at, { every: 1000 })).toBeUndefined();
  });
});

describe('cron expressions as written', () => {
  const refused = (pattern: string, tz = 'UTC'): string => {
    try {
      checkCron(pattern, tz);
    } catch (err) {
      expect(err).toBeInstanceOf(ApiError);
      expect((err as ApiError).type).toBe('validation.malformed');
      return (err as ApiError).message;
    }
    throw new Error(`'${pattern}' in ${tz} was accepted`);
  };

  it('has 5 or 6 fields: fewer would be read with fields the writer did not mean', () => {
    expect(refused('0 9 1-5 *')).toMatch(/5 fields .* or 6 .*not 4/);
    expect(refused('0 0 9 * * * 2027')).toMatch(/not 7/);
    expect(refused('@midnight')).toMatch(/not 1/);
    for (const ok of ['0 9 * * 1-5', '*/5 0 9 * * MON-FRI', '0 0 * * THU', '0 0 L * *', '0 0 * * 1#2']) expect(() => checkCron(ok, 'Europe/Paris')).not.toThrow();
  });

  it('names no hashed value (H), which would be a different time at every tick', () => {
    expect(refused('H * * * *')).toMatch(/minute field uses H/);
    expect(refused('0 H(0-5) * * *')).toMatch(/hour field uses H/);
    expect(refused('0 0 * * H')).toMatch(/day of week field uses H/);
  });

  it('is refused with its reason when it is no cron expression, never fires, or its zone is unknown', () => {
    expect(refused('61 * * * *')).toMatch(/not a cron expression/);
    expect(refused('0 0 31 2,4 *')).toMatch(/never fires/);
    expect(refused('every day at noon ok')).toMatch(/not a cron expression/);
    expect(refused('0 3 * * *', 'Mars/Olympus')).toMatch(/timezone: 'Mars\/Olympus' is not an IANA time zone/);
    expect(refused('0 3 * * *', 'UTC+5')).toMatch(/not an IANA time zone/);
  });
});
