/**
 * OTLP/protobuf encoding of finished spans, in one pass on the thread that finished them.
 *
 * The bytes are those of the SDK's own `ProtobufTraceSerializer` (a unit test holds the two
 * equal, field for field and byte for byte): the same grouping by resource and instrumentation
 * scope, the same field order, the same fields written when zero. What differs is the cost: one
 * pass instead of a size estimate then a write, the resource and scope messages encoded once per
 * process instead of once per batch, ids written from their hex without a buffer per id, and
 * ASCII strings copied a character at a time. A batch then crosses to the export thread as one
 * transferred buffer (no structured clone of the spans) and the thread only sends it.
 */
import type { Attributes, AttributeValue, HrTime } from '@opentelemetry/api';
import type { ReadableSpan } from '@opentelemetry/sdk-trace-node';

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

  /** The bytes written so far, copied into their own buffer (transferable), and the writer emptied. */
  take(): Uint8Array {
    const out = new Uint8Array(this.pos);
    out.set(this.buf.subarray(0, this.pos));
    this.pos = 0;
    return out;
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
      w.tag(1, 2);
      w.string(value);
      return;
    case 'boolean':
      w.tag(2, 0);
      w.varint(value ? 1 : 0);
      return;
    case 'number':
      if (Number.isInteger(value) && value >= MIN_INT64 && value < MAX_INT64) {
        w.tag(3, 0);
        w.varint(value);
      } else {
        w.tag(4, 1);
        w.double(value);
      }
      return;
    default:
      break;
  }
  if (value instanceof Uint8Array) {
    w.tag(7, 2);
    w.bytes(value);
  } else if (Array.isArray(value)) {
    w.tag(5, 2);
    const list = w.begin();
    for (const item of value) {
      w.tag(1, 2);
      const at = w.begin();
      anyValue(w, item);
      w.end(at);
    }
    w.end(list);
  } else if (typeof value === 'object' && value !== null) {
    w.tag(6, 2);
    const list = w.begin();
    for (const key in value) {
      if (!Object.prototype.hasOwnProperty.call(value, key)) continue;
      w.tag(1, 2);
      keyValue(w, key, (value as Record<string, unknown>)[key]);
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
    kw.tag(1, 2);
    kw.string(key);
    bytes = kw.take();
    if (encodedKeys.size < MAX_ENCODED_KEYS) encodedKeys.set(key, bytes);
  }
  w.raw(bytes);
}

/** One KeyValue message (its tag already written). */
function keyValue(w: ProtoWriter, key: string, value: unknown): void {
  const at = w.begin();
  writeKey(w, key);
  w.tag(2, 2);
  const v = w.begin();
  anyValue(w, value);
  w.end(v);
  w.end(at);
}

function attributes(w: ProtoWriter, attrs: Attributes, field: number): void {
  for (const key in attrs) {
    if (!Object.prototype.hasOwnProperty.call(attrs, key)) continue;
    w.tag(field, 2);
    keyValue(w, key, attrs[key] as AttributeValue | undefined);
  }
}

function span(w: ProtoWriter, s: ReadableSpan): void {
  const ctx = s.spanContext();
  const parent = s.parentSpanContext;
  const at = w.begin();
  w.tag(1, 2);
  w.hex(ctx.traceId);
  w.tag(2, 2);
  w.hex(ctx.spanId);
  const state = ctx.traceState?.serialize();
  if (state) {
    w.tag(3, 2);
    w.string(state);
  }
  if (parent?.spanId) {
    w.tag(4, 2);
    w.hex(parent.spanId);
  }
  w.tag(5, 2);
  w.string(s.name);
  // The API's kinds start at INTERNAL = 0; OTLP's at UNSPECIFIED = 0.
  const kind = s.kind == null ? 0 : s.kind + 1;
  if (kind !== 0) {
    w.tag(6, 0);
    w.varint(kind);
  }
  w.tag(7, 1);
  w.hrTime(s.startTime);
  w.tag(8, 1);
  w.hrTime(s.endTime);
  attributes(w, s.attributes, 9);
  w.tag(10, 0);
  w.varint(s.droppedAttributesCount);
  for (const e of s.events) {
    w.tag(11, 2);
    const ev = w.begin();
    w.tag(1, 1);
    w.hrTime(e.time);
    w.tag(2, 2);
    w.string(e.name);
    if (e.attributes) attributes(w, e.attributes, 3);
    w.tag(4, 0);
    w.varint(e.droppedAttributesCount || 0);
    w.end(ev);
  }
  w.tag(12, 0);
  w.varint(s.droppedEventsCount);
  for (const l of s.links) {
    w.tag(13, 2);
    const lk = w.begin();
    w.tag(1, 2);
    w.hex(l.context.traceId);
    w.tag(2, 2);
    w.hex(l.context.spanId);
    const linkState = l.context.traceState?.serialize();
    if (linkState) {
      w.tag(3, 2);
      w.string(linkState);
    }
    if (l.attributes) attributes(w, l.attributes, 4);
    w.tag(5, 0);
    w.varint(l.droppedAttributesCount || 0);
    w.tag(6, 5);
    w.fixed32(spanFlags(l.context.traceFlags, l.context.isRemote));
    w.end(lk);
  }
  w.tag(14, 0);
  w.varint(s.droppedLinksCount);
  w.tag(15, 2);
  const st = w.begin();
  if (s.status.message) {
    w.tag(2, 2);
    w.string(s.status.message);
  }
  w.tag(3, 0);
  w.varint(s.status.code);
  w.end(st);
  w.tag(16, 5);
  w.fixed32(spanFlags(ctx.traceFlags, parent?.isRemote));
  w.end(at);
}

type Resource = ReadableSpan['resource'];
type Scope = ReadableSpan['instrumentationScope'];

/** The Resource message (field 1 of ResourceSpans) of each resource, encoded once. */
const resourceBytes = new WeakMap<Resource, Uint8Array>();
/** The InstrumentationScope message (field 1 of ScopeSpans) of each scope, encoded once. */
const scopeBytes = new WeakMap<Scope, Uint8Array>();

function encodedResource(resource: Resource): Uint8Array {
  let bytes = resourceBytes.get(resource);
  if (!bytes) {
    const w = new ProtoWriter(1024);
    w.tag(1, 2);
    const at = w.begin();
    if (resource.attributes) attributes(w, resource.attributes, 1);
    w.tag(2, 0);
    w.varint(0);
    w.end(at);
    resourceBytes.set(resource, (bytes = w.take()));
  }
  return bytes;
}

function encodedScope(scope: Scope): Uint8Array {
  let bytes = scopeBytes.get(scope);
  if (!bytes) {
    const w = new ProtoWriter(256);
    w.tag(1, 2);
    const at = w.begin();
    w.tag(1, 2);
    w.string(scope.name);
    if (scope.version) {
      w.tag(2, 2);
      w.string(scope.version);
    }
    const attrs = (scope as { attributes?: Attributes }).attributes;
    if (attrs) attributes(w, attrs, 3);
    const dropped = (scope as { droppedAttributesCount?: number }).droppedAttributesCount;
    if (dropped) {
      w.tag(4, 0);
      w.varint(dropped);
    }
    w.end(at);
    scopeBytes.set(scope, (bytes = w.take()));
  }
  return bytes;
}

/** An ExportTraceServiceRequest holding `spans`, written to `w` (grouped by resource, then scope, in first-seen order). */
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
    w.tag(1, 2);
    const rs = w.begin();
    w.raw(encodedResource(resource));
    for (const [scope, list] of scopes) {
      w.tag(2, 2);
      const ss = w.begin();
      w.raw(encodedScope(scope));
      for (const s of list) {
        w.tag(2, 2);
        span(w, s);
      }
      if (scope.schemaUrl) {
        w.tag(3, 2);
        w.string(scope.schemaUrl);
      }
      w.end(ss);
    }
    if (resource.schemaUrl) {
      w.tag(3, 2);
      w.string(resource.schemaUrl);
    }
    w.end(rs);
  }
}
