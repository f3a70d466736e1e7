import { getNextMillis, type RepeatStrategy } from 'bullmq';
import { ApiError } from '@agentplane/core';

/**
 * Cron schedules in an IANA time zone (docs/AUTOMATIONS.md, "Cron and daylight saving time").
 *
 * An expression is matched against the zone's wall clock, computed here rather than by the cron
 * library's own zone arithmetic: that one drops a day's fire whose local time falls in a gap that
 * ends another day (a change at midnight, as in America/Santiago or Africa/Cairo, or one of 30
 * minutes), and computes a second fire of a local time the clock repeats when the time it counts
 * from lies in the repeated hour (a tick taken late). The rules:
 *
 * - a local time the clock skips fires once, at the first instant after the change (several
 *   skipped times of one change make one fire);
 * - a local time the clock repeats fires once, at its first occurrence;
 * - an expression that runs every hour (hour field `*`) keeps its pace in real time instead: the
 *   times of a skipped hour do not exist, and those of a repeated hour fire in both.
 */

const MINUTE = 60_000;
const HOUR = 60 * MINUTE;
/** The longest change of a zone's offset this handles (in use today: two hours, Antarctica/Troll). */
const MAX_SHIFT = 3 * HOUR;
const DAY = 24 * HOUR;

const formats = new Map<string, Intl.DateTimeFormat>();

function formatOf(tz: string): Intl.DateTimeFormat {
  let f = formats.get(tz);
  if (!f) {
    f = new Intl.DateTimeFormat('en-US', {
      timeZone: tz, hourCycle: 'h23', year: 'numeric', month: 'numeric', day: 'numeric', hour: 'numeric', minute: 'numeric', second: 'numeric',
    });
    formats.set(tz, f);
  }
  return f;
}

/** The zone's offset from UTC at instant `t` (ms): its wall clock reads `t + offset`. */
export function zoneOffset(tz: string, t: number): number {
  const p: Record<string, string> = {};
  for (const part of formatOf(tz).formatToParts(new Date(t))) p[part.type] = part.value;
  const wall = Date.UTC(Number(p.year), Number(p.month) - 1, Number(p.day), Number(p.hour), Number(p.minute), Number(p.second));
  return wall - Math.floor(t / 1000) * 1000;
}

/** The first instant (whole seconds) after `from` whose offset is not `o` (`from` has `o`; `to` does not). */
function changeBetween(tz: string, from: number, to: number, o: number): number {
  let a = Math.floor(from / 1000);
  let b = Math.ceil(to / 1000);
  while (b - a > 1) {
    const mid = Math.floor((a + b) / 2);
    if (zoneOffset(tz, mid * 1000) === o) a = mid;
    else b = mid;
  }
  return b * 1000;
}

/**
 * The first instant in (`from`, `to`] at which the offset `o` (that of `from`) changes, or null.
 * Offsets are compared a day apart: a zone does not change and change back within a day.
 */
function nextChange(tz: string, from: number, to: number, o: number): number | null {
  for (let lo = from; lo < to;) {
    const hi = Math.min(lo + DAY, to);
    if (zoneOffset(tz, hi) !== o) return changeBetween(tz, lo, hi, o);
    lo = hi;
  }
  return null;
}

/** Whether an expression fires in every hour of the day (its hour field is a plain wildcard; a predefined `@hourly` is read too). */
export function runsEveryHour(pattern: string): boolean {
  const fields = pattern.trim().split(/\s+/);
  if (fields.length === 1) return /^@(hourly|minutely|secondly)$/.test(fields[0] ?? '');
  return /^(\*|\?|\*\/1|0-23)$/.test(fields[fields.length - 4] ?? '');
}

/**
 * The first time after `afterMs` at which `pattern` fires in the time zone `tz` (the rules
 * above), or undefined when it never fires again. Throws when the expression is not one.
 *
 * It walks the instants after `afterMs` one stretch of constant offset at a time: the first wall
 * time the expression matches in a stretch is its fire there, unless that wall time already showed
 * before a change that turned the clock back (then its first showing was the fire); a stretch
 * that ends in a gap fires at the gap's end when the expression matches a wall time inside it.
 */
export function nextCronMillis(afterMs: number, pattern: string, tz: string): number | undefined {
  const everyHour = runsEveryHour(pattern);
  /** Instants up to `s` are done: the next fire is after it. */
  let s = afterMs;
  for (let steps = 0; steps < 10_000; steps++) {
    const o = zoneOffset(tz, s + 1);
    const w = getNextMillis(s + o, { pattern, tz: 'UTC' });
    if (w === undefined) return undefined;
    const at = w - o;
    const change = nextChange(tz, s + 1, at, o);
    if (change !== null) {
      // The stretch ends before the match. A clock turned forward skips the wall times
      // [change + o, change + later): a match among them fires as the clock jumps.
      const later = zoneOffset(tz, change);
      if (later > o && w < change + later && !everyHour) return change;
      s = change - 1;
      continue;
    }
    // A wall time the clock shows a second time (it was turned back less than MAX_SHIFT ago) fired
    // at its first showing: the stretch resumes past the repeated wall times.
    const earlier = zoneOffset(tz, at - MAX_SHIFT);
    if (!everyHour && earlier > o && zoneOffset(tz, w - earlier) === earlier) {
      const turnedBack = changeBetween(tz, at - MAX_SHIFT, at, earlier);
      s = Math.max(s + 1, turnedBack + earlier - o - 1);
      continue;
    }
    return at;
  }
  return undefined;
}

/**
 * The Job Scheduler's repeat strategy for cron schedules (the queue's and the worker's: one makes
 * a scheduler's first job, the other each following one).
 */
export const cronRepeatStrategy: RepeatStrategy = (millis, opts) => {
  if (!opts.pattern) return undefined;
  if (opts.immediately) return Date.now();
  const start = opts.startDate === undefined ? 0 : new Date(opts.startDate).getTime();
  return nextCronMillis(Math.max(millis, start), opts.pattern, opts.tz ?? 'UTC');
};

const CRON_FIELDS = ['second', 'minute', 'hour', 'day of month', 'month', 'day of week'];

/**
 * A schedule's cron expression and time zone as written: 400 `validation.malformed` unless the
 * expression has 5 fields (minute to day of week) or 6 (seconds first), names no hashed value
 * (`H`: a different time each time the next one is computed), and fires at some time from now on
 * in an IANA time zone.
 */
export function checkCron(pattern: string, timezone: string, nowMs = Date.now()): void {
  try {
    new Intl.DateTimeFormat('en-US', { timeZone: timezone });
  } catch {
    throw new ApiError('validation.malformed', `body.trigger.timezone: '${timezone}' is not an IANA time zone`);
  }
  const fields = pattern.trim().split(/\s+/);
  if (fields.length !== 5 && fields.length !== 6) {
    throw new ApiError('validation.malformed', `body.trigger.cron: a cron expression has 5 fields (minute hour day-of-month month day-of-week) or 6 (seconds first), not ${fields.length}`);
  }
  const names = CRON_FIELDS.slice(6 - fields.length);
  fields.forEach((f, i) => {
    // Month and weekday names (`THU`) are not hashed values.
    if (f.replace(/[a-z]{3}/gi, '').includes('H')) {
      throw new ApiError('validation.malformed', `body.trigger.cron: the ${names[i] ?? 'field'} field uses H (a hashed value), which is not supported`);
    }
  });
  let next: number | undefined;
  try {
    next = nextCronMillis(nowMs, pattern, timezone);
  } catch (err) {
    throw new ApiError('validation.malformed', `body.trigger.cron: not a cron expression (${err instanceof Error ? err.message : String(err)})`);
  }
  if (next === undefined) throw new ApiError('validation.malformed', 'body.trigger.cron: not a cron expression (it never fires)');
}
