/**
 * An ended span's exported form (what the OTLP encoder reads), made from what a deferred span
 * recorded, by the rules of the OpenTelemetry SDK's own span (`SpanImpl` of
 * @opentelemetry/sdk-trace, with the default limits the platform's providers use): attribute
 * values checked with the SDK's `isAttributeValue` and `sanitizeAttributes`, at most 128
 * attributes, events and links (the oldest event or link dropped first, and counted), 128
 * attributes per event and per link, an exception as an `exception` event with `exception.type`,
 * `exception.message` and `exception.stacktrace`, times as `[seconds, nanoseconds]`, and an end
 * before the start moved to the start. `tracing-span-data.test.ts` holds the OTLP bytes of both
 * equal for the same calls.
 *
 * This is how the OTLP/protobuf export path (the default) skips making an SDK span per span: the
 * event loop encodes a batch of these in one loop and hands the bytes to the exporter.
 */
import { diag, SpanStatusCode, type Attributes, type AttributeValue, type Exception, type HrTime, type Link, type SpanContext, type SpanKind, type SpanStatus, type TimeInput } from '@opentelemetry/api';
import { hrTime, isAttributeValue, isTimeInputHrTime, millisToHrTime, sanitizeAttributes } from '@opentelemetry/core';
import type { EncodableSpan } from './otlp-protobuf.js';

/** The SDK provider's default span limits (the platform's providers set none). */
const LIMIT = 128;

interface SpanEventData {
  name: string;
  attributes?: Attributes;
  time: HrTime;
  droppedAttributesCount: number;
}

interface SpanLinkData {
  context: SpanContext;
  attributes?: Attributes;
  droppedAttributesCount?: number;
}

/** What a deferred span recorded after its links given at the start, in call order. */
export type RecordedCall =
  | { kind: 'event'; name: string; attributes: Attributes | undefined; time: TimeInput }
  | { kind: 'exception'; exception: Exception; time: TimeInput }
  | { kind: 'link'; link: Link };

/** A deferred span's raw record: what its calls set, before any of the SDK's rules. */
export interface RawSpan {
  name: string;
  kind: SpanKind;
  spanContext(): SpanContext;
  parent: SpanContext | undefined;
  links: Link[] | undefined;
  startTime: TimeInput;
  endTime: TimeInput;
  attributes: Attributes | undefined;
  /** Already by the SDK's rules (`statusAfter`). */
  status: SpanStatus | undefined;
  recorded: RecordedCall[] | undefined;
}

/** Milliseconds between the epoch and `performance.timeOrigin + performance.now()`, as the SDK's span corrects performance times. */
function performanceOffset(): number {
  return Date.now() - (performance.timeOrigin + performance.now());
}

/**
 * A time input as the SDK's span converts it (`SpanImpl._getTime`: a number no later than
 * `performance.now()` is a performance time, any other an epoch time); now when there is none.
 * `perfNow`: `performance.now()` read once for a batch of spans that all ended before it.
 */
function hrOf(t: TimeInput | undefined, perfNow: number): HrTime {
  if (typeof t === 'number') return t <= perfNow ? hrTime(t + performanceOffset()) : millisToHrTime(t);
  if (t instanceof Date) return millisToHrTime(t.getTime());
  if (t !== undefined && isTimeInputHrTime(t)) return t;
  return millisToHrTime(Date.now());
}

/** The status a span holds after `setStatus(next)` when it held `current` (the SDK's rules). */
export function statusAfter(current: SpanStatus | undefined, next: SpanStatus): SpanStatus | undefined {
  if (next.code === SpanStatusCode.UNSET || current?.code === SpanStatusCode.OK) return current;
  if (next.code !== SpanStatusCode.ERROR) return { code: next.code };
  if (typeof next.message === 'string') return { code: next.code, message: next.message };
  if (next.message != null) diag.warn(`Dropping invalid status.message of type '${typeof next.message}', expected 'string'`);
  return { code: next.code };
}

/** Attributes checked and limited as an event's or a link's (the SDK sanitizes, then keeps the first 128). */
function limited(raw: Attributes | undefined): { attributes: Attributes; dropped: number; count: number } {
  const sanitized = sanitizeAttributes(raw);
  const attributes: Attributes = {};
  let dropped = 0;
  let count = 0;
  for (const key in sanitized) {
    if (!Object.prototype.hasOwnProperty.call(sanitized, key)) continue;
    if (count >= LIMIT) {
      dropped++;
      continue;
    }
    attributes[key] = sanitized[key];
    count++;
  }
  return { attributes, dropped, count };
}

/**
 * Whether a span's attributes are exported as they are: no more than the limit, each with a
 * key and a valid value (what nearly every span holds; then no copy is made).
 */
function exportedAsIs(raw: Attributes): boolean {
  let count = 0;
  for (const key in raw) {
    if (!Object.prototype.hasOwnProperty.call(raw, key)) return false;
    const value = raw[key];
    if (value == null || key.length === 0 || !isAttributeValue(value) || ++count > LIMIT) return false;
  }
  return true;
}

const NO_ATTRIBUTES: Attributes = Object.freeze({});

/**
 * A span's attributes as exported, and how many the limit dropped: the span's own object when
 * nothing is left out (a span's record is not written after it ended), else a copy made by the
 * SDK's checks (invalid keys and values warned about and skipped, the first 128 kept).
 */
function spanAttributes(raw: Attributes | undefined): { attributes: Attributes; dropped: number } {
  if (raw === undefined) return { attributes: NO_ATTRIBUTES, dropped: 0 };
  if (exportedAsIs(raw)) return { attributes: raw, dropped: 0 };
  const attributes: Attributes = {};
  let dropped = 0;
  let count = 0;
  for (const key in raw) {
    if (!Object.prototype.hasOwnProperty.call(raw, key)) continue;
    const value = raw[key] as AttributeValue | undefined;
    if (value == null) continue;
    if (key.length === 0) {
      diag.warn(`Invalid attribute key: ${key}`);
      continue;
    }
    if (!isAttributeValue(value)) {
      diag.warn(`Invalid attribute value set for key: ${key}`);
      continue;
    }
    if (count >= LIMIT) {
      dropped++;
      continue;
    }
    attributes[key] = value;
    count++;
  }
  return { attributes, dropped };
}

const NONE: readonly never[] = Object.freeze([]);
const UNSET: SpanStatus = Object.freeze({ code: SpanStatusCode.UNSET });

/**
 * The exported form of a raw span record (module comment). `perfNow`: `performance.now()` read
 * after the span ended (once for a batch); the SDK tells performance times from epoch times by it.
 */
export function spanData(s: RawSpan, perfNow: number = performance.now()): EncodableSpan {
  const { attributes, dropped: droppedAttributesCount } = spanAttributes(s.attributes);
  const startTime = hrOf(s.startTime, perfNow);
  const context = s.spanContext();
  if (s.links === undefined && s.recorded === undefined) {
    // Nearly every span: no links, events or exceptions to apply the limits to.
    return {
      name: s.name, kind: s.kind, spanContext: () => context, parentSpanContext: s.parent, startTime, endTime: notBefore(hrOf(s.endTime, perfNow), startTime),
      attributes, droppedAttributesCount, events: NONE, droppedEventsCount: 0, links: NONE, droppedLinksCount: 0,
      status: s.status ?? UNSET,
    };
  }
  const events: SpanEventData[] = [];
  const links: SpanLinkData[] = [];
  let droppedEventsCount = 0;
  let droppedLinksCount = 0;
  const addLink = (link: Link): void => {
    if (links.length >= LIMIT) {
      links.shift();
      droppedLinksCount++;
    }
    const { attributes: a, dropped, count: n } = limited(link.attributes);
    const out: SpanLinkData = { context: link.context };
    if (n > 0) out.attributes = a;
    if (dropped > 0) out.droppedAttributesCount = dropped;
    links.push(out);
  };
  const addEvent = (name: string, raw: Attributes | undefined, time: TimeInput): void => {
    if (events.length >= LIMIT) {
      events.shift();
      droppedEventsCount++;
    }
    const { attributes: a, dropped } = limited(raw);
    events.push({ name, attributes: a, time: hrOf(time, perfNow), droppedAttributesCount: dropped });
  };
  for (const link of s.links ?? []) addLink(link);
  for (const call of s.recorded ?? []) {
    if (call.kind === 'link') addLink(call.link);
    else if (call.kind === 'event') addEvent(call.name, call.attributes, call.time);
    else {
      const a = exceptionAttributes(call.exception);
      if (a) addEvent('exception', a, call.time);
      else diag.warn(`Failed to record an exception ${String(call.exception)}`);
    }
  }
  return {
    name: s.name, kind: s.kind, spanContext: () => context, parentSpanContext: s.parent, startTime, endTime: notBefore(hrOf(s.endTime, perfNow), startTime),
    attributes, droppedAttributesCount, events, droppedEventsCount, links, droppedLinksCount,
    status: s.status ?? UNSET,
  };
}

/** An end before the start is moved to the start (as the SDK's span does). */
function notBefore(end: HrTime, start: HrTime): HrTime {
  return end[0] < start[0] || (end[0] === start[0] && end[1] < start[1]) ? [start[0], start[1]] : end;
}

/** An exception's event attributes as the SDK's `recordException` makes them, or null when it has neither type nor message. */
function exceptionAttributes(exception: Exception): Attributes | null {
  const a: Attributes = {};
  if (typeof exception === 'string') {
    a['exception.message'] = exception;
  } else if (exception) {
    if (exception.code) a['exception.type'] = exception.code.toString();
    else if (exception.name) a['exception.type'] = exception.name;
    if (exception.message) a['exception.message'] = exception.message;
    if (exception.stack) a['exception.stacktrace'] = exception.stack;
  }
  return a['exception.type'] || a['exception.message'] ? a : null;
}
