/**
 * OTLP/protobuf encoding of finished spans, in one pass, a batch at a time.
 *
 * The bytes are those of the SDK's own `ProtobufTraceSerializer` (a unit test holds the two
 * equal, field for field and byte for byte): the same grouping by resource and instrumentation
 * scope, the same field order, the same fields written when zero. What differs is the cost: one
 * pass instead of a size estimate then a write, the resource and scope messages encoded once per
 * process instead of once per batch, ids written from their hex without a buffer per id, and
 * ASCII strings copied a character at a time. A batch is encoded when it is exported, in one
 * loop over its spans: measured against encoding each span as it ends, the API spent about 5% less
 * CPU per traced request (the encoder's code stays hot through the loop, while a span encoded at
 * its end runs it cold, between requests).
 */
import type { Attributes, AttributeValue, HrTime, SpanContext, SpanKind, SpanStatus } from '@opentelemetry/api';
import type { ReadableSpan } from '@opentelemetry/sdk-trace-node';

/** The fields of an ended span the encoder reads: the SDK's `ReadableSpan` has them, and so has what tracing-span-data.ts makes of a deferred span. */
export interface EncodableSpan {
  name: string;
  kind: SpanKind;
  spanContext(): SpanContext;
  parentSpanContext?: SpanContext | undefined;
  startTime: HrTime;
  endTime: HrTime;
  attributes: Attributes;
  droppedAttributesCount: number;
  events: readonly { time: HrTime; name: string; attributes?: Attributes | undefined; droppedAttributesCount?: number | undefined }[];
  droppedEventsCount: number;
  links: readonly { context: SpanContext; attributes?: Attributes | undefined; droppedAttributesCount?: number | undefined }[];
  droppedLinksCount: number;
  status: SpanStatus;
}

/** OTLP span flags: the low byte is the W3C trace flags; bit 8 says whether bit 9 (remote parent) is known. */
const HAS_IS_REMOTE = 0x100;
const IS_REMOTE = 0x200;
const spanFlags = (traceFlags: number, isRemote: boolean | undefined): number => (traceFlags & 0xff) | HAS_IS_REMOTE | (isRemote ? IS_REMOTE : 0);

const MIN_INT64 = -(2 ** 63);
const MAX_INT64 = 2 ** 63;

/** A growable protobuf writer whose length prefixes are written after their message (1 byte reserved, moved when longer). */
export class ProtoWriter {
  private buf: Buffer;
  pos = 0;

  constructor(initialBytes = 64 * 1024) {
    this.buf = Buffer.allocUnsafe(initialBytes);
  }

  /** The bytes written so far, copied into their own buffer, and the writer emptied. */
  take(): Uint8Array {
    const out = new Uint8Array(this.pos);
    out.set(this.buf.subarray(0, this.pos));
    this.pos = 0;
    return out;
  }

  /** The bytes written so far, in the writer's own buffer (valid until the writer writes again). */
  view(): Uint8Array {
    return this.buf.subarray(0, this.pos);
  }

  private ensure(n: number): void {
    if (this.pos + n <= this.buf.length) return;
    let size = this.buf.length * 2;
    while (size < this.pos + n) size *= 2;
    const next = Buffer.allocUnsafe(size);
    this.buf.copy(next, 0, 0, this.pos);
    this.buf = next;
  }

  tag(field: number, wireType: number): void {
    const t = (field << 3) | wireType;
    if (t < 0x80) {
      this.ensure(1);
      this.buf[this.pos++] = t;
    } else {
      this.varint(t);
    }
  }

  /** A string field (wire type 2). */
  stringField(field: number, s: string): void {
    this.tag(field, 2);
    this.string(s);
  }

  /** A bytes field written from hex digits (a trace or span id). */
  hexField(field: number, hex: string): void {
    this.tag(field, 2);
    this.hex(hex);
  }

  /** A varint field (wire type 0). */
  varintField(field: number, value: number): void {
    this.tag(field, 0);
    this.varint(value);
  }

  /** A fixed64 nanosecond time stamp field (wire type 1). */
  timeField(field: number, t: HrTime): void {
    this.tag(field, 1);
    this.hrTime(t);
  }

  /** A fixed32 field (wire type 5). */
  fixed32Field(field: number, value: number): void {
    this.tag(field, 5);
    this.fixed32(value);
  }

  /** Start an embedded message field: its tag, then `begin()`; close it with `end()`. */
  beginField(field: number): number {
    this.tag(field, 2);
    return this.begin();
  }

  /** A varint: unsigned 32-bit values directly, anything else as a 64-bit two's complement integer. */
  varint(value: number): void {
    this.ensure(10);
    const b = this.buf;
    if (value >= 0 && value <= 0xffffffff) {
      let v = value >>> 0;
      while (v > 0x7f) {
        b[this.pos++] = (v & 0x7f) | 0x80;
        v >>>= 7;
      }
      b[this.pos++] = v;
      return;
    }
    let [low, high] = split64(value);
    while (high > 0 || low > 0x7f) {
      b[this.pos++] = (low & 0x7f) | 0x80;
      low = ((low >>> 7) | (high << 25)) >>> 0;
      high >>>= 7;
    }
    b[this.pos++] = low & 0x7f;
  }

  fixed32(value: number): void {
    this.ensure(4);
    this.buf.writeUInt32LE(value >>> 0, this.pos);
    this.pos += 4;
  }

  /** An OpenTelemetry HrTime as fixed64 nanoseconds since the epoch (exact: no float rounding). */
  hrTime(t: HrTime): void {
    this.ensure(8);
    const [seconds, nanos] = t;
    // seconds × 1e9 + nanos exceeds 2^53: split seconds so each product stays exact.
    const lowSeconds = seconds & 0xffff;
    const highSeconds = (seconds / 0x10000) >>> 0;
    const fromLow = lowSeconds * 1e9;
    const fromHigh = highSeconds * 1e9;
    const sumLow = (fromLow >>> 0) + (((fromHigh & 0xffff) * 0x10000) >>> 0) + nanos;
    const low = sumLow >>> 0;
    const high = (Math.floor(fromLow / 0x100000000) + ((fromHigh / 0x10000) >>> 0) + Math.floor(sumLow / 0x100000000)) >>> 0;
    this.buf.writeUInt32LE(low, this.pos);
    this.buf.writeUInt32LE(high, this.pos + 4);
    this.pos += 8;
  }

  double(value: number): void {
    this.ensure(8);
    this.buf.writeDoubleLE(value, this.pos);
    this.pos += 8;
  }

  /** A length-prefixed UTF-8 string. */
  string(s: string): void {
    const n = s.length;
    this.ensure(n + 5);
    const start = this.pos;
    this.varint(n);
    const b = this.buf;
    let p = this.pos;
    for (let i = 0; i < n; i++) {
      const c = s.charCodeAt(i);
      if (c > 0x7f) {
        // Not ASCII: rewrite it whole (lone surrogates become U+FFFD, as TextEncoder writes them).
        this.pos = start;
        this.bytes(Buffer.from(s, 'utf8'));
        return;
      }
      b[p++] = c;
    }
    this.pos = p;
  }

  bytes(bytes: Uint8Array): void {
    this.varint(bytes.length);
    this.ensure(bytes.length);
    this.buf.set(bytes, this.pos);
    this.pos += bytes.length;
  }

  /** Hex digits (a trace or span id) as length-prefixed bytes. */
  hex(hex: string): void {
    const n = hex.length >>> 1;
    this.varint(n);
    this.ensure(n);
    const b = this.buf;
    for (let i = 0; i < n; i++) b[this.pos++] = (nibble(hex.charCodeAt(2 * i)) << 4) | nibble(hex.charCodeAt(2 * i + 1));
  }

  raw(bytes: Uint8Array): void {
    this.ensure(bytes.length);
    this.buf.set(bytes, this.pos);
    this.pos += bytes.length;
  }

  /** Start a length-delimited message: returns where its length goes. */
  begin(): number {
    this.ensure(1);
    return this.pos++;
  }

  /** End the message begun at `at`: write its length there, moving the message when the length takes more than one byte. */
  end(at: number): void {
    const length = this.pos - at - 1;
    if (length < 0x80) {
      this.buf[at] = length;
      return;
    }
    let size = 1;
    for (let v = length >>> 7; v > 0; v >>>= 7) size++;
    this.ensure(size - 1);
    this.buf.copyWithin(at + size, at + 1, this.pos);
    this.pos += size - 1;
    let v = length;
    let p = at;
    while (v > 0x7f) {
      this.buf[p++] = (v & 0x7f) | 0x80;
      v >>>= 7;
    }
    this.buf[p] = v;
  }
}

/** The value of each hex digit by character code (upper or lower case); like the SDK, anything else is not checked. */
const NIBBLE = (() => {
  const t = new Uint8Array(128);
  for (let c = 0; c < 128; c++) t[c] = (c >= 48 && c <= 57 ? c - 48 : c >= 97 && c <= 102 ? c - 87 : c - 55) & 0xff;
  return t;
})();
const nibble = (c: number): number => (c < 128 ? (NIBBLE[c] as number) : (c - 55) & 0xff);

/** A number outside 0..2^32-1 as the low and high words of its 64-bit two's complement. */
function split64(value: number): [number, number] {
  const abs = Math.abs(value);
  let low = abs >>> 0;
  let high = (abs / 0x100000000) >>> 0;
  if (value < 0) {
    low = ~low >>> 0;
    high = ~high >>> 0;
    low = (low + 1) >>> 0;
    if (low === 0) high = (high + 1) >>> 0;
  }
  return [low, high];
}

function anyValue(w: ProtoWriter, value: unknown): void {
  switch (typeof value) {
    case 'string':
      return w.stringField(1, value);
    case 'boolean':
      return w.varintField(2, value ? 1 : 0);
    case 'number':
      if (Number.isInteger(value) && value >= MIN_INT64 && value < MAX_INT64) return w.varintField(3, value);
      w.tag(4, 1);
      return w.double(value);
    default:
      break;
  }
  if (value instanceof Uint8Array) {
    w.tag(7, 2);
    w.bytes(value);
  } else if (Array.isArray(value)) {
    const list = w.beginField(5);
    for (const item of value) {
      const at = w.beginField(1);
      anyValue(w, item);
      w.end(at);
    }
    w.end(list);
  } else if (typeof value === 'object' && value !== null) {
    const list = w.beginField(6);
    for (const key in value) {
      if (Object.prototype.hasOwnProperty.call(value, key)) keyValue(w, 1, key, (value as Record<string, unknown>)[key]);
    }
    w.end(list);
  }
  // null and undefined: an empty AnyValue.
}

/**
 * Attribute keys as their encoded KeyValue.key field (tag, length, UTF-8), kept per process: the
 * keys come from a small fixed set (semantic-convention and platform names).
 */
const encodedKeys = new Map<string, Uint8Array>();
const MAX_ENCODED_KEYS = 1024;

function writeKey(w: ProtoWriter, key: string): void {
  let bytes = encodedKeys.get(key);
  if (!bytes) {
    const kw = new ProtoWriter(key.length * 3 + 8);
    kw.stringField(1, key);
    bytes = kw.take();
    if (encodedKeys.size < MAX_ENCODED_KEYS) encodedKeys.set(key, bytes);
  }
  w.raw(bytes);
}

/** One KeyValue message as field `field`. */
function keyValue(w: ProtoWriter, field: number, key: string, value: unknown): void {
  const at = w.beginField(field);
  writeKey(w, key);
  const v = w.beginField(2);
  anyValue(w, value);
  w.end(v);
  w.end(at);
}

function attributes(w: ProtoWriter, attrs: Attributes, field: number): void {
  for (const key in attrs) {
    if (Object.prototype.hasOwnProperty.call(attrs, key)) keyValue(w, field, key, attrs[key] as AttributeValue | undefined);
  }
}

/** One Span message as field 2 of ScopeSpans (field numbers of opentelemetry/proto/trace/v1). */
export function encodeSpan(w: ProtoWriter, s: EncodableSpan): void {
  const ctx = s.spanContext();
  const parent = s.parentSpanContext;
  const at = w.beginField(2);
  w.hexField(1, ctx.traceId);
  w.hexField(2, ctx.spanId);
  const state = ctx.traceState?.serialize();
  if (state) w.stringField(3, state);
  if (parent?.spanId) w.hexField(4, parent.spanId);
  w.stringField(5, s.name);
  // The API's kinds start at INTERNAL = 0; OTLP's at UNSPECIFIED = 0.
  const kind = s.kind == null ? 0 : s.kind + 1;
  if (kind !== 0) w.varintField(6, kind);
  w.timeField(7, s.startTime);
  w.timeField(8, s.endTime);
  attributes(w, s.attributes, 9);
  w.varintField(10, s.droppedAttributesCount);
  for (const e of s.events) {
    const ev = w.beginField(11);
    w.timeField(1, e.time);
    w.stringField(2, e.name);
    if (e.attributes) attributes(w, e.attributes, 3);
    w.varintField(4, e.droppedAttributesCount || 0);
    w.end(ev);
  }
  w.varintField(12, s.droppedEventsCount);
  for (const l of s.links) {
    const lk = w.beginField(13);
    w.hexField(1, l.context.traceId);
    w.hexField(2, l.context.spanId);
    const linkState = l.context.traceState?.serialize();
    if (linkState) w.stringField(3, linkState);
    if (l.attributes) attributes(w, l.attributes, 4);
    w.varintField(5, l.droppedAttributesCount || 0);
    w.fixed32Field(6, spanFlags(l.context.traceFlags, l.context.isRemote));
    w.end(lk);
  }
  w.varintField(14, s.droppedLinksCount);
  const st = w.beginField(15);
  if (s.status.message) w.stringField(2, s.status.message);
  w.varintField(3, s.status.code);
  w.end(st);
  w.fixed32Field(16, spanFlags(ctx.traceFlags, parent?.isRemote));
  w.end(at);
}

type Resource = ReadableSpan['resource'];
type Scope = ReadableSpan['instrumentationScope'];

/** The Resource message (field 1 of ResourceSpans) of each resource, encoded once. */
const resourceBytes = new WeakMap<Resource, Uint8Array>();
/** The InstrumentationScope message (field 1 of ScopeSpans) of each scope, encoded once. */
const scopeBytes = new WeakMap<Scope, Uint8Array>();

/** `message(w)` written once per `key` and kept: the same bytes for every later batch. */
function encodedOnce<K extends object>(cache: WeakMap<K, Uint8Array>, key: K, message: (w: ProtoWriter) => void): Uint8Array {
  let bytes = cache.get(key);
  if (!bytes) {
    const w = new ProtoWriter(1024);
    message(w);
    cache.set(key, (bytes = w.take()));
  }
  return bytes;
}

const encodedResource = (resource: Resource): Uint8Array => encodedOnce(resourceBytes, resource, (w) => {
  const at = w.beginField(1);
  if (resource.attributes) attributes(w, resource.attributes, 1);
  w.varintField(2, 0);
  w.end(at);
});

const encodedScope = (scope: Scope): Uint8Array => encodedOnce(scopeBytes, scope, (w) => {
  const at = w.beginField(1);
  w.stringField(1, scope.name);
  if (scope.version) w.stringField(2, scope.version);
  const attrs = (scope as { attributes?: Attributes }).attributes;
  if (attrs) attributes(w, attrs, 3);
  const dropped = (scope as { droppedAttributesCount?: number }).droppedAttributesCount;
  if (dropped) w.varintField(4, dropped);
  w.end(at);
});

/** An ExportTraceServiceRequest's one ResourceSpans and ScopeSpans, begun (`beginScopeSpans`). */
export interface OpenScopeSpans {
  resourceAt: number;
  scopeAt: number;
  resource: Resource;
  scope: Scope;
}

/**
 * Begin an ExportTraceServiceRequest of one resource and one scope in `w` (empty): the spans'
 * encoded bytes (`encodeSpan`'s) are then written after it as they come, and `endScopeSpans`
 * closes it. The bytes are `encodeTraceRequest`'s for the same spans.
 */
export function beginScopeSpans(w: ProtoWriter, resource: Resource, scope: Scope): OpenScopeSpans {
  const resourceAt = w.beginField(1);
  w.raw(encodedResource(resource));
  const scopeAt = w.beginField(2);
  w.raw(encodedScope(scope));
  return { resourceAt, scopeAt, resource, scope };
}

/** Close what `beginScopeSpans` began: `w` then holds the whole request. */
export function endScopeSpans(w: ProtoWriter, open: OpenScopeSpans): void {
  if (open.scope.schemaUrl) w.stringField(3, open.scope.schemaUrl);
  w.end(open.scopeAt);
  if (open.resource.schemaUrl) w.stringField(3, open.resource.schemaUrl);
  w.end(open.resourceAt);
}

/**
 * An ExportTraceServiceRequest holding `spans`, written to `w` (grouped by resource, then scope,
 * in first-seen order). The export itself writes one resource and scope as spans come
 * (`beginScopeSpans`); this whole-request form is what the encoder is checked against the SDK's
 * serializer with.
 */
export function encodeTraceRequest(w: ProtoWriter, spans: readonly ReadableSpan[]): void {
  const groups = new Map<Resource, Map<Scope, ReadableSpan[]>>();
  for (const s of spans) {
    let scopes = groups.get(s.resource);
    if (!scopes) groups.set(s.resource, (scopes = new Map()));
    let list = scopes.get(s.instrumentationScope);
    if (!list) scopes.set(s.instrumentationScope, (list = []));
    list.push(s);
  }
  for (const [resource, scopes] of groups) {
    const rs = w.beginField(1);
    w.raw(encodedResource(resource));
    for (const [scope, list] of scopes) {
      const ss = w.beginField(2);
      w.raw(encodedScope(scope));
      for (const s of list) encodeSpan(w, s);
      if (scope.schemaUrl) w.stringField(3, scope.schemaUrl);
      w.end(ss);
    }
    if (resource.schemaUrl) w.stringField(3, resource.schemaUrl);
    w.end(rs);
  }
}
