/**
 * A reader of OTLP/protobuf trace export requests (ExportTraceServiceRequest), for tests: the
 * spans with their resource's `service.name`, in the shape of OTLP/JSON (ids as hex, attribute
 * values as `stringValue` / `intValue` / `boolValue` / `doubleValue`). Field numbers are those of
 * opentelemetry/proto/trace/v1 and common/v1.
 */
export interface ProtoValue { stringValue?: string; intValue?: string; boolValue?: boolean; doubleValue?: number; arrayValue?: { values: ProtoValue[] } }
export interface ProtoAttr { key: string; value: ProtoValue }
export interface ProtoSpan { traceId: string; spanId: string; parentSpanId?: string; name: string; kind: number; attributes: ProtoAttr[]; status?: { code?: number; message?: string } }

type Field = { n: number; wire: number; int: bigint; bytes: Buffer };

function varint(b: Buffer, at: number): [bigint, number] {
  let v = 0n;
  let shift = 0n;
  for (;;) {
    const c = b[at++] as number;
    v |= BigInt(c & 0x7f) << shift;
    if ((c & 0x80) === 0) return [v, at];
    shift += 7n;
  }
}

function fields(b: Buffer): Field[] {
  const out: Field[] = [];
  let at = 0;
  while (at < b.length) {
    const [tag, next] = varint(b, at);
    at = next;
    const n = Number(tag >> 3n);
    const wire = Number(tag & 7n);
    if (wire === 0) {
      const [v, after] = varint(b, at);
      out.push({ n, wire, int: v, bytes: Buffer.alloc(0) });
      at = after;
    } else if (wire === 1) {
      out.push({ n, wire, int: b.readBigUInt64LE(at), bytes: b.subarray(at, at + 8) });
      at += 8;
    } else if (wire === 5) {
      out.push({ n, wire, int: BigInt(b.readUInt32LE(at)), bytes: b.subarray(at, at + 4) });
      at += 4;
    } else if (wire === 2) {
      const [len, after] = varint(b, at);
      out.push({ n, wire, int: len, bytes: b.subarray(after, after + Number(len)) });
      at = after + Number(len);
    } else {
      throw new Error(`unexpected wire type ${wire}`);
    }
  }
  return out;
}

function value(b: Buffer): ProtoValue {
  const v: ProtoValue = {};
  for (const f of fields(b)) {
    if (f.n === 1) v.stringValue = f.bytes.toString('utf8');
    else if (f.n === 2) v.boolValue = f.int !== 0n;
    else if (f.n === 3) v.intValue = BigInt.asIntN(64, f.int).toString();
    else if (f.n === 4) v.doubleValue = f.bytes.readDoubleLE(0);
    else if (f.n === 5) v.arrayValue = { values: fields(f.bytes).filter((x) => x.n === 1).map((x) => value(x.bytes)) };
  }
  return v;
}

function attr(b: Buffer): ProtoAttr {
  let key = '';
  let v: ProtoValue = {};
  for (const f of fields(b)) {
    if (f.n === 1) key = f.bytes.toString('utf8');
    else if (f.n === 2) v = value(f.bytes);
  }
  return { key, value: v };
}

function span(b: Buffer): ProtoSpan {
  const s: ProtoSpan = { traceId: '', spanId: '', name: '', kind: 0, attributes: [] };
  for (const f of fields(b)) {
    if (f.n === 1) s.traceId = f.bytes.toString('hex');
    else if (f.n === 2) s.spanId = f.bytes.toString('hex');
    else if (f.n === 4 && f.bytes.length > 0) s.parentSpanId = f.bytes.toString('hex');
    else if (f.n === 5) s.name = f.bytes.toString('utf8');
    else if (f.n === 6) s.kind = Number(f.int);
    else if (f.n === 9) s.attributes.push(attr(f.bytes));
    else if (f.n === 15) {
      const st: { code?: number; message?: string } = {};
      for (const g of fields(f.bytes)) {
        if (g.n === 3) st.code = Number(g.int);
        else if (g.n === 2) st.message = g.bytes.toString('utf8');
      }
      s.status = st;
    }
  }
  return s;
}

/** Every span of one export request, with its resource's `service.name`. */
export function readTraceRequest(body: Buffer): { service: string; span: ProtoSpan }[] {
  const out: { service: string; span: ProtoSpan }[] = [];
  for (const rs of fields(body).filter((f) => f.n === 1)) {
    let service = '?';
    const spans: ProtoSpan[] = [];
    for (const f of fields(rs.bytes)) {
      if (f.n === 1) {
        for (const a of fields(f.bytes).filter((x) => x.n === 1).map((x) => attr(x.bytes))) if (a.key === 'service.name') service = a.value.stringValue ?? '?';
      } else if (f.n === 2) {
        for (const sf of fields(f.bytes)) if (sf.n === 2) spans.push(span(sf.bytes));
      }
    }
    for (const s of spans) out.push({ service, span: s });
  }
  return out;
}
