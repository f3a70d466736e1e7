import { Agent, request } from 'node:http';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { CATALOG } from './harness/catalog.js';
import { startPlatform, type Platform } from './harness/platform.js';

/**
 * A black-box sweep of the wire contract: for every operation the OpenAPI document lists, a set
 * of malformed requests (path ids, query parameters, bodies, content types, Idempotency-Keys),
 * each of which must be refused with a 4xx whose body names a catalog type under its catalog
 * status, never a 5xx. The requests are generated from the document, so a new operation is
 * swept as soon as it is declared. Valid ids for path parameters come from real resources (made
 * here, or read back from the operations that list them), so a probe reaches as deep into an
 * operation as its own mistake allows.
 */


const VERSION = '2026-08-27';
/** The general request-body limit (BODY_LIMIT_BYTES, default 4 MiB). */
const BODY_LIMIT = 4 * 1024 * 1024;
/** Operations the contract gives a byte limit of their own (the Project tree envelope, above the general one). */
const OWN_BODY_LIMIT = new Set(['projects.createProject', 'projects.createRevision', 'projects.pushProject']);
const IN_FLIGHT = 8;

const MALFORMED = ['validation.malformed'] as const;
const ABSENT_OR_MALFORMED = ['validation.malformed', 'validation.not_found'] as const;

type Json = Record<string, unknown>;

interface Parameter {
  name: string;
  in: 'path' | 'query' | 'header';
  required?: boolean;
  schema: Json;
}

interface Op {
  id: string;
  method: string;
  path: string;
  parameters: Parameter[];
  /** The JSON body's schema, when the operation takes a JSON body. */
  body: Json | undefined;
  /** The content type of a body read as it streams (a multipart upload, a tar, a webhook delivery). */
  upload: string | undefined;
  /** An SSE stream: only its refusals before the stream opens are probed. */
  stream: boolean;
  anonymous: boolean;
  idempotent: boolean;
}

interface Probe {
  op: Op;
  what: string;
  method: string;
  /** The request target, already encoded as it goes on the wire. */
  path: string;
  headers?: Record<string, string>;
  body?: string | Buffer;
  /** The error types this refusal may carry. */
  expect: readonly string[];
}

interface Answer {
  status: number;
  contentType: string;
  text: string;
}

/** Resources made for the sweep, by prefix, and where each is read. */
const FIXTURES: Array<[string, string]> = [
  ['agent', '/v1/agents/{id}'], ['env', '/v1/environments/{id}'], ['sess', '/v1/sessions/{id}'], ['memstore', '/v1/memory-stores/{id}'],
  ['vlt', '/v1/vaults/{id}'], ['prin', '/v1/principals/{id}'], ['perm', '/v1/permission-assignments/{id}'], ['apol', '/v1/action-policies/{id}'],
  ['skill', '/v1/skills/{id}'], ['proj', '/v1/projects/{id}'], ['whe', '/v1/webhook-endpoints/{id}'], ['auto', '/v1/automations/{id}'],
  ['file', '/v1/files/{id}'], ['adep', '/v1/agent-deployments/{id}'], ['surf', '/v1/surface-scopes/{id}'], ['aini', '/v1/agent-installations/{id}'],
];
/** Prefixes of resources that belong to one workspace (another workspace's reads do not find them). */
const WORKSPACE_OWNED = new Set([
  'agent', 'env', 'sess', 'sthr', 'sres', 'memstore', 'vlt', 'prin', 'pcred', 'perm', 'apol', 'skill', 'proj', 'file', 'whe', 'auto', 'afire',
  'adep', 'exti', 'surf', 'aini',
]);

let p: Platform;
let doc: Json;
let ops: Op[] = [];
let connections: Agent;
/** A real id per prefix (`agent`, `sess`, …), of a resource in the default workspace. */
const ids = new Map<string, string>();
let otherWorkspace: string;

const zeros = (prefix: string) => `${prefix}_${'0'.repeat(32)}`;
const idPrefixOf = (schema: Json): string | undefined => /^\^([a-z]+)_\[0-9a-f\]\{32\}\$$/.exec(String(schema.pattern ?? ''))?.[1];

/** Follow a local `$ref` (`#/components/...`); anything else is returned as it is. */
function deref(value: unknown): Json {
  let v = (value ?? {}) as Json;
  for (let i = 0; i < 16 && typeof v.$ref === 'string' && v.$ref.startsWith('#/'); i++) {
    v = ((v.$ref as string).slice(2).split('/').reduce<unknown>((acc, k) => (acc as Json | undefined)?.[k], doc) ?? {}) as Json;
  }
  return v;
}

function send(method: string, path: string, headers: Record<string, string> = {}, body?: string | Buffer): Promise<Answer> {
  return new Promise((resolve, reject) => {
    let answered = false;
    const req = request({
      host: '127.0.0.1', port: p.port, method, path, agent: connections,
      headers: {
        authorization: `Bearer ${p.bootstrap.root_key}`, 'service-version': VERSION,
        ...(body !== undefined ? { 'content-type': 'application/json' } : {}),
        ...(body !== undefined && !headers['transfer-encoding'] ? { 'content-length': String(Buffer.byteLength(body)) } : {}),
        ...headers,
      },
    }, (res) => {
      answered = true;
      const contentType = String(res.headers['content-type'] ?? '');
      // A stream opened for a malformed request is a finding in itself: note it, read no further.
      if (contentType.includes('text/event-stream')) {
        res.destroy();
        resolve({ status: res.statusCode ?? 0, contentType, text: '' });
        return;
      }
      const chunks: Buffer[] = [];
      res.on('data', (c: Buffer) => chunks.push(c));
      res.on('end', () => resolve({ status: res.statusCode ?? 0, contentType, text: Buffer.concat(chunks).toString('utf8') }));
      res.on('error', reject);
    });
    // The server may answer a refused body before it has all of it and close: the answer counts.
    req.on('error', (err) => {
      if (!answered) reject(err);
    });
    if (headers['transfer-encoding'] && body !== undefined) {
      const bytes = Buffer.from(body);
      for (let at = 0; at < bytes.length; at += 256 * 1024) req.write(bytes.subarray(at, at + 256 * 1024));
      req.end();
    } else {
      req.end(body);
    }
  });
}

async function inPool<T>(items: readonly T[], n: number, fn: (item: T) => Promise<void>): Promise<void> {
  let next = 0;
  await Promise.all(Array.from({ length: n }, async () => {
    while (next < items.length) {
      const item = items[next++] as T;
      await fn(item);
    }
  }));
}

/** What is wrong with an answer to a malformed request (undefined: a proper refusal). */
function judge(answer: Answer, expected: readonly string[]): string | undefined {
  if (answer.contentType.includes('text/event-stream')) return `${answer.status} opened an event stream`;
  let type: unknown;
  try {
    type = (JSON.parse(answer.text) as { error?: { type?: unknown } }).error?.type;
  } catch {
    return `${answer.status} with a body that is not JSON: ${answer.text.slice(0, 120)}`;
  }
  const message = (JSON.parse(answer.text) as { error?: { message?: unknown } }).error?.message;
  const said = `${answer.status} ${String(type)}: ${String(message).slice(0, 160)}`;
  if (typeof type !== 'string') return `${answer.status} without an error type: ${answer.text.slice(0, 120)}`;
  if (CATALOG[type] === undefined) return `${said} (not a catalog type)`;
  if (CATALOG[type] !== answer.status) return `${said} (the catalog says ${CATALOG[type]})`;
  if (answer.status < 400 || answer.status >= 500) return `${said} (not a 4xx)`;
  if (!expected.includes(type)) return `${said} (expected ${expected.join(' or ')})`;
  return undefined;
}

// ---- Building requests from the document ------------------------------------------------------

/** The value of a path parameter that the operation accepts: a real id when one is known. */
function validPathValue(param: Parameter): { value: string; real: boolean } {
  const prefix = idPrefixOf(param.schema);
  if (prefix) {
    const real = ids.get(prefix);
    return { value: real ?? zeros(prefix), real: real !== undefined };
  }
  if (param.schema.type === 'integer') return { value: String(param.schema.minimum ?? 1), real: true };
  return { value: 'sweep-name', real: true };
}

/** The operation's path with its parameters filled, `override` replacing some (already encoded). */
function fill(op: Op, override: Record<string, string> = {}): { path: string; real: boolean } {
  let real = true;
  let path = op.path;
  for (const param of op.parameters.filter((x) => x.in === 'path')) {
    let value = override[param.name];
    if (value === undefined) {
      const v = validPathValue(param);
      value = encodeURIComponent(v.value);
      real &&= v.real;
    }
    path = path.replace(`{${param.name}}`, value);
  }
  return { path, real };
}

/** The operation's required query parameters with values they accept (`except` one), as `?a=1&b=2` or ''. */
function requiredQuery(op: Op, except?: string, extra?: string): string {
  const pairs = op.parameters.filter((x) => x.in === 'query' && x.required && x.name !== except)
    .map((x) => `${x.name}=${encodeURIComponent(validQueryValue(x.schema))}`);
  if (extra !== undefined) pairs.push(extra);
  return pairs.length > 0 ? `?${pairs.join('&')}` : '';
}

/** A value a query parameter of this schema accepts. */
function validQueryValue(schema: Json): string {
  const s = deref(schema);
  const prefix = idPrefixOf(s);
  if (prefix) return ids.get(prefix) ?? zeros(prefix);
  const branches = (s.anyOf ?? s.oneOf) as Json[] | undefined;
  if (branches?.[0]?.const !== undefined) return String(branches[0].const);
  if (s.type === 'integer' || s.type === 'number') return String(s.minimum ?? 1);
  if (s.type === 'boolean') return 'true';
  if (s.format === 'date-time') return '2020-01-01T00:00:00Z';
  if (String(s.pattern ?? '').startsWith('^c1_')) return 'c1_0';
  if (String(s.pattern ?? '').startsWith('^(agent')) return 'agent.message';
  return 'x';
}

/** Values a query parameter of this schema must refuse. */
function invalidQueryValues(name: string, schema: Json): string[] {
  const s = deref(schema);
  const out: string[] = [];
  if (s.type === 'integer' || s.type === 'number') {
    // Text JavaScript's `+` reads as a number: none is a number written in decimal digits.
    out.push('abc', '', '1.5x', 'Infinity', '-Infinity', '1e400', '0x10', ' 5', '+5');
    if (s.type === 'integer') out.push('1.5', '1e2', '05');
    if (typeof s.minimum === 'number') out.push(String(s.minimum - 1), '-1');
    if (typeof s.maximum === 'number') out.push('1e9', String(s.maximum + 1));
    out.push('99999999999999999999999');
  } else if (s.type === 'boolean') {
    out.push('maybe', '2');
  } else if (s.anyOf || s.oneOf || s.enum) {
    out.push('zzz', '');
  } else if (s.type === 'string') {
    const prefix = idPrefixOf(s);
    if (prefix) out.push(zeros(prefix === 'sess' ? 'agent' : 'sess'), `${prefix}_`, `${prefix}_${'A'.repeat(32)}`);
    if (s.format === 'date-time') out.push('yesterday');
    if (String(s.pattern ?? '').startsWith('^c1_')) {
      // A forged cursor: out of the pattern, too long, and in it but naming no position the API made.
      out.push('c1_', `c1_${'a'.repeat(600)}`, 'eyJwb3MiOjF9', 'Zm9vYmFy/+==', 'c1_zz', 'c1_0', `c1_${'z'.repeat(500)}`, `c1_${'9'.repeat(300)}`);
    }
    if (typeof s.minLength === 'number' && s.minLength > 0) out.push('');
    if (typeof s.maxLength === 'number') out.push('x'.repeat(s.maxLength + 1));
    if (name === 'path') out.push('\u0000', '/a', 'a/');
  }
  return [...new Set(out)];
}

/** Values, already encoded, at the edges of what a query parameter of this schema takes (some taken, some not). */
function edgeQueryValues(schema: Json): string[] {
  const s = deref(schema);
  if (s.type === 'integer' || s.type === 'number') {
    return [String(s.maximum ?? 2 ** 53 - 1), String(2 ** 53 - 1), String(s.minimum ?? 0), '1e3', '0x10', '%2B1', '%201'];
  }
  if (s.format === 'date-time') {
    return ['0000-01-01T00:00:00Z', '9999-12-31T23:59:59.999999999Z', '2020-01-01T00:00:00%2B23:59', '2020-02-30T00:00:00Z', '2020-01-01T23:59:60Z', '2016-12-31T23:59:60Z', '1970-01-01T00:00:00-00:00', '2020-01-01t00:00:00z', '2020-01-01%2000:00:00Z'];
  }
  if (s.type === 'string' && !idPrefixOf(s)) {
    const long = 'x'.repeat(typeof s.maxLength === 'number' ? s.maxLength : 1000);
    return ['%00', '%ED%A0%80', '%FF', '%F0%9F%92%A9', '%E2%80%AE', long, '*', '%25', '..%2F..', 'a%0Ab', '%5C'];
  }
  return [];
}

/** The JSON types a schema admits (undefined: any). */
function admittedTypes(schema: unknown): Set<string> | undefined {
  const s = deref(schema);
  if (s.const !== undefined) return new Set([jsonType(s.const)]);
  if (Array.isArray(s.enum)) return new Set((s.enum as unknown[]).map(jsonType));
  const branches = (s.anyOf ?? s.oneOf) as unknown[] | undefined;
  if (Array.isArray(branches)) {
    const all = new Set<string>();
    for (const b of branches) {
      const t = admittedTypes(b);
      if (!t) return undefined;
      for (const x of t) all.add(x);
    }
    return all;
  }
  if (typeof s.type === 'string') return new Set(s.type === 'number' ? ['number', 'integer'] : [s.type]);
  if (Array.isArray(s.type)) return new Set(s.type as string[]);
  if (s.properties || s.patternProperties) return new Set(['object']);
  if (s.items) return new Set(['array']);
  return undefined;
}

function jsonType(v: unknown): string {
  if (v === null) return 'null';
  if (Array.isArray(v)) return 'array';
  if (typeof v === 'number') return Number.isInteger(v) ? 'integer' : 'number';
  return typeof v;
}

const WRONG: Array<[string, unknown]> = [
  ['string', 'zz-wrong'], ['number', 12345.5], ['boolean', true], ['object', { zz: 1 }], ['array', [[1]]], ['null', null],
];

/** Up to two values of JSON types this schema does not admit. */
function wrongValues(schema: unknown): unknown[] {
  const admitted = admittedTypes(schema);
  if (!admitted) return [];
  return WRONG.filter(([t]) => !admitted.has(t) && !(t === 'number' && admitted.has('number'))).slice(0, 2).map(([, v]) => v);
}

/** The declared top-level fields of a body schema (merged over its shapes). */
function declaredFields(schema: Json): Array<[string, Json]> {
  const s = deref(schema);
  const out = new Map<string, Json>();
  const shapes = [s, ...(((s.anyOf ?? s.oneOf) as Json[] | undefined) ?? []).map(deref)];
  for (const shape of shapes) {
    for (const [k, v] of Object.entries((shape.properties as Record<string, Json> | undefined) ?? {})) if (!out.has(k)) out.set(k, v);
  }
  return [...out];
}

const nested = (depth: number, leaf: string, open: (i: number) => string, close: string) =>
  `${Array.from({ length: depth }, (_, i) => open(i)).join('')}${leaf}${close.repeat(depth)}`;

function probesOf(op: Op): Probe[] {
  const out: Probe[] = [];
  const filled = fill(op);
  const base = { path: `${filled.path}${requiredQuery(op)}`, real: filled.real };
  const add = (what: string, init: Omit<Probe, 'op' | 'what' | 'method'> & { method?: string }) =>
    out.push({ op, what, method: init.method ?? op.method, ...init });
  const bodyFor = (): string | undefined => (op.body || op.method !== 'GET' && op.method !== 'DELETE' ? '{}' : undefined);

  // Path parameters: every one in turn wrong, the others valid.
  for (const param of op.parameters.filter((x) => x.in === 'path')) {
    const prefix = idPrefixOf(param.schema);
    const bad: Array<[string, string]> = [
      ['an empty-ish value', '%20'], ['a 600-character value', `${prefix ?? 'x'}_${'a'.repeat(600)}`],
      ['a NUL byte', `${prefix ?? 'x'}_%00`], ['a dot-dot segment', '..'], ['an encoded dot-dot', '%2E%2E'],
      ['unicode', `${prefix ?? 'x'}_%E2%98%83${'0'.repeat(31)}`], ['a broken escape', `${prefix ?? 'x'}_%E0%A4%A`],
      ['a percent-encoded slash', `${prefix ?? 'x'}_%2F${'0'.repeat(31)}`],
    ];
    if (prefix) {
      bad.push(['a wrong prefix', zeros(prefix === 'sess' ? 'agent' : 'sess')], ['the bare prefix', `${prefix}_`],
        ['upper-case hex', `${prefix}_${'A'.repeat(32)}`], ['a short id', `${prefix}_${'0'.repeat(31)}`]);
    } else if (param.schema.type === 'integer') {
      bad.push(['a word for a number', 'abc'], ['zero', '0'], ['a negative number', '-1'], ['a fraction', '1.5'], ['a huge number', '99999999999999999999999'],
        ['infinity', 'Infinity'], ['an exponent', '1e0'], ['hexadecimal', '0x1'], ['a leading zero', '01']);
    }
    for (const [what, value] of bad) {
      add(`path ${param.name}: ${what}`, { path: `${fill(op, { [param.name]: value }).path}${requiredQuery(op)}`, body: bodyFor(), expect: MALFORMED });
    }
  }

  // Query parameters: an unknown one, each declared one repeated and with refused values.
  const query = op.parameters.filter((x) => x.in === 'query');
  add('an unknown query parameter', { path: `${filled.path}${requiredQuery(op, undefined, 'zz_unknown=1')}`, body: bodyFor(), expect: MALFORMED });
  for (const pair of ['__proto__=1', 'constructor=1', '%zz=1', '=1', 'toString=x']) {
    add(`the query name in ${JSON.stringify(pair)}`, { path: `${filled.path}${requiredQuery(op, undefined, pair)}`, body: bodyFor(), expect: MALFORMED });
  }

  // Headers: the version and, for a credential, the workspace it acts in.
  if (op.parameters.some((x) => x.in === 'header' && x.name === 'Service-Version')) {
    for (const version of ['2020-01-01', 'latest', `${VERSION}, ${VERSION}`]) {
      add(`Service-Version ${JSON.stringify(version)}`, { path: base.path, body: bodyFor(), headers: { 'service-version': version }, expect: MALFORMED });
    }
  }
  if (!op.anonymous) {
    for (const [what, value, expect] of [
      ['another prefix', zeros('sess'), MALFORMED], ['600 characters', `wrkspc_${'a'.repeat(600)}`, MALFORMED], ['no such workspace', zeros('wrkspc'), ['validation.not_found']],
    ] as const) {
      add(`Service-Workspace-Id: ${what}`, { path: base.path, body: bodyFor(), headers: { 'service-workspace-id': value }, expect });
    }
  }
  if (op.stream && op.method === 'GET') {
    // The stream's cursor, refused before the stream opens.
    for (const value of ['abc', '-1', '1.5', '99999999999999999999999', '999999']) {
      add(`Last-Event-ID ${JSON.stringify(value)}`, { path: base.path, headers: { 'last-event-id': value }, expect: filled.real ? MALFORMED : ABSENT_OR_MALFORMED });
    }
    add('Last-Event-ID and last_event_id that disagree', { path: `${filled.path}?last_event_id=1`, headers: { 'last-event-id': '0' }, expect: filled.real ? MALFORMED : ABSENT_OR_MALFORMED });
  }
  for (const param of query) {
    const valid = encodeURIComponent(validQueryValue(param.schema));
    const at = (pair: string) => `${filled.path}${requiredQuery(op, param.name, pair)}`;
    add(`query ${param.name}: repeated`, { path: at(`${param.name}=${valid}&${param.name}=${valid}`), body: bodyFor(), expect: MALFORMED });
    add(`query ${param.name}: in array syntax`, { path: at(`${param.name}[]=${valid}`), body: bodyFor(), expect: MALFORMED });
    for (const value of invalidQueryValues(param.name, param.schema)) {
      // With a placeholder id in the path, a value the schema takes may meet the absent resource first.
      const expect = filled.real ? MALFORMED : ABSENT_OR_MALFORMED;
      add(`query ${param.name}=${JSON.stringify(value.slice(0, 24))}`, { path: at(`${param.name}=${encodeURIComponent(value)}`), body: bodyFor(), expect });
    }
  }

  if (op.stream && op.method === 'GET') return out;

  // Bodies.
  if (op.upload) {
    // A body read as it streams: its own content type and limit; an anonymous one checks its caller's proof.
    const refusals = ['validation.malformed', 'validation.payload_too_large', 'validation.not_found', 'auth.invalid_key'];
    add('a body of the wrong content type', { path: base.path, body: '{}', headers: { 'content-type': 'text/plain' }, expect: refusals });
    add('garbage of its content type', { path: base.path, body: '{"a":', headers: { 'content-type': op.upload }, expect: refusals });
    add('a body over the general limit, of its content type', { path: base.path, body: oversize(), headers: { 'content-type': op.upload }, expect: refusals });
  } else if (op.method !== 'GET') {
    add('invalid JSON', { path: base.path, body: '{"a":', expect: MALFORMED });
    add('a JSON array', { path: base.path, body: '[]', expect: MALFORMED });
    add('a JSON string', { path: base.path, body: '"x"', expect: MALFORMED });
    add('a JSON null', { path: base.path, body: 'null', expect: MALFORMED });
    add('a JSON number', { path: base.path, body: '42', expect: MALFORMED });
    add('an unknown top-level field', { path: base.path, body: '{"zz_unknown":1}', expect: MALFORMED });
    add('a body nested 200 levels deep', { path: base.path, body: `{"zz":${nested(200, '1', () => '{"a":', '}')}}`, expect: MALFORMED });
    add('a body of arrays nested 200 levels deep', { path: base.path, body: `{"zz":${nested(200, '1', () => '[', ']')}}`, expect: MALFORMED });
    add('a text/plain body', { path: base.path, body: '{}', headers: { 'content-type': 'text/plain' }, expect: MALFORMED });
    add('a form body', { path: base.path, body: 'a=b', headers: { 'content-type': 'application/x-www-form-urlencoded' }, expect: MALFORMED });
    add('a JSON body without a content type', { path: base.path, body: '{}', headers: { 'content-type': '' }, expect: MALFORMED });
    const tooLarge = OWN_BODY_LIMIT.has(op.id) ? ['validation.malformed', 'validation.payload_too_large'] : ['validation.payload_too_large'];
    add('a body over the limit', { path: base.path, body: oversize(), expect: tooLarge });
    add('a body over the limit, sent in chunks', { path: base.path, body: oversize(), headers: { 'transfer-encoding': 'chunked' }, expect: tooLarge });
    add('a field named __proto__', { path: base.path, body: '{"__proto__":{"zz":1}}', expect: MALFORMED });
    add('a field named constructor', { path: base.path, body: '{"constructor":{"prototype":{"zz":1}}}', expect: MALFORMED });
    if (op.body) {
      for (const [name, schema] of declaredFields(op.body)) {
        // A leap second is RFC 3339, but no time JavaScript can read: refused like any other.
        if (deref(schema).format === 'date-time') {
          add(`body ${name}: a leap second`, { path: base.path, body: JSON.stringify({ [name]: '2016-12-31T23:59:60Z' }), expect: MALFORMED });
        }
        const values = wrongValues(schema);
        if (admittedTypes(schema)?.has('integer') && !admittedTypes(schema)?.has('number')) values.push(2 ** 53, -(2 ** 53), '1e400');
        for (const value of values) {
          const text = value === '1e400' ? `{${JSON.stringify(name)}:1e400}` : JSON.stringify({ [name]: value });
          add(`body ${name}: ${value === '1e400' ? value : JSON.stringify(value)}`, { path: base.path, body: text, expect: MALFORMED });
        }
        if (refusesNesting(schema)) {
          add(`body ${name}: nested 200 levels deep`, { path: base.path, body: `{${JSON.stringify(name)}:${nested(200, '1', (i) => (i % 2 ? '[' : '{"a":'), '')}${closers(200)}}`, expect: MALFORMED });
        }
        // One level further: each field of an object-typed field.
        for (const [sub, subSchema] of declaredFields(schema)) {
          const [value] = wrongValues(subSchema);
          if (value === undefined) continue;
          add(`body ${name}.${sub}: ${JSON.stringify(value)}`, { path: base.path, body: JSON.stringify({ [name]: { [sub]: value } }), expect: MALFORMED });
        }
      }
    }
  }

  // Idempotency-Key: too long, bad characters, empty.
  if (op.idempotent) {
    for (const [what, key] of [['too long', 'k'.repeat(256)], ['with a space', 'a key'], ['with a non-ASCII character', 'caf\u00e9'], ['empty', '']] as const) {
      add(`an Idempotency-Key ${what}`, { path: base.path, body: op.upload ? undefined : '{}', headers: { 'idempotency-key': key }, expect: MALFORMED });
    }
  }
  return out;
}

/**
 * Whether a field refuses `{"a": [{"a": [...]}]}`: it takes neither objects nor arrays, or only
 * closed objects without an `a` (a free-form field, an event's payload, takes it).
 */
function refusesNesting(schema: unknown): boolean {
  const admitted = admittedTypes(schema);
  if (!admitted) return false;
  if (!admitted.has('object') && !admitted.has('array')) return true;
  if (admitted.has('array')) return false;
  const shapes = [deref(schema), ...((((deref(schema).anyOf ?? deref(schema).oneOf) as unknown[] | undefined) ?? []).map(deref))].filter((x) => x.type === 'object');
  return shapes.length > 0 && shapes.every((x) => x.additionalProperties === false && !x.patternProperties && !(x.properties as Json | undefined)?.a);
}

/** Closers for `nested(depth, leaf, i % 2 ? '[' : '{"a":', '')`. */
function closers(depth: number): string {
  let s = '';
  for (let i = depth - 1; i >= 0; i--) s += i % 2 ? ']' : '}';
  return s;
}

let oversized: Buffer | undefined;
/** A JSON body one byte over the general limit (one buffer, shared by every probe). */
function oversize(): Buffer {
  if (!oversized) {
    const head = '{"zz":"';
    const tail = '"}';
    oversized = Buffer.alloc(BODY_LIMIT + 1, 'x');
    oversized.write(head, 0);
    oversized.write(tail, BODY_LIMIT + 1 - tail.length);
  }
  return oversized;
}

// ---- The platform and its resources --------------------------------------------------------------

function readOps(): Op[] {
  const out: Op[] = [];
  for (const [path, item] of Object.entries(doc.paths as Record<string, Record<string, Json>>)) {
    // The JSON-RPC edges (A2A, MCP) and the runner's connection speak their own protocols.
    if (path.startsWith('/a2a') || path.startsWith('/v1/mcp') || /\/connect$|\/ws$/.test(path)) continue;
    for (const [method, raw] of Object.entries(item)) {
      const parameters = ((raw.parameters as unknown[] | undefined) ?? []).map((x) => deref(x) as unknown as Parameter);
      const content = (deref(raw.requestBody).content ?? {}) as Record<string, { schema?: unknown }>;
      const types = Object.keys(content);
      const id = String(raw.operationId);
      const upload = types.find((t) => t !== 'application/json') ?? (id === 'automations.ingestAutomationWebhook' ? 'application/json' : undefined);
      out.push({
        id, method: method.toUpperCase(), path, parameters,
        body: !upload && content['application/json'] ? deref(content['application/json'].schema) : undefined,
        upload,
        stream: /stream/i.test(id) || path.endsWith('/stream'),
        anonymous: Array.isArray(raw.security) && raw.security.length === 0,
        idempotent: parameters.some((x) => x.in === 'header' && x.name.toLowerCase() === 'idempotency-key'),
      });
    }
  }
  return out;
}

/** Every id in a JSON value, by prefix (the first one seen of each prefix is kept). */
function harvest(value: unknown): void {
  if (typeof value === 'string') {
    const m = /^([a-z]+)_[0-9a-f]{32}$/.exec(value);
    if (m?.[1] && !ids.has(m[1])) ids.set(m[1], value);
  } else if (Array.isArray(value)) {
    for (const v of value) harvest(v);
  } else if (typeof value === 'object' && value !== null) {
    for (const v of Object.values(value)) harvest(v);
  }
}

async function create(path: string, body: Json, key?: string): Promise<Json> {
  const r = await send('POST', path, key ? { 'idempotency-key': key } : {}, JSON.stringify(body));
  expect(r.status, `POST ${path}: ${r.text.slice(0, 300)}`).toBeLessThan(300);
  const json = JSON.parse(r.text) as Json;
  harvest(json);
  return json;
}

beforeAll(async () => {
  p = await startPlatform();
  connections = new Agent({ keepAlive: true, maxSockets: IN_FLIGHT });
  const r = await fetch(`${p.baseUrl}/v1/openapi.json`);
  expect(r.status).toBe(200);
  doc = (await r.json()) as Json;
  ops = readOps();

  ids.set('org', p.bootstrap.organization_id);
  ids.set('wrkspc', p.bootstrap.workspace_id);
  const agentId = String((await create('/v1/agents', { name: 'sweep', model: 'default' })).id);
  const envId = String((await create('/v1/environments', { name: 'sweep', image: 'agentplane/sandbox:1' })).id);
  const session = String((await create('/v1/sessions', { agent: agentId, environment_id: envId, title: 'sweep' })).id);
  // The Session's own thread (not one of a Session another fixture starts in the background).
  harvest(JSON.parse((await send('GET', `/v1/sessions/${session}/threads`)).text) as unknown);
  const store = String((await create('/v1/memory-stores', { name: 'sweep' })).id);
  const doc1 = await send('PUT', `/v1/memory-stores/${store}/document`, {}, JSON.stringify({ path: 'a/b.md', content: 'hello' }));
  expect(doc1.status, doc1.text).toBeLessThan(300);
  await create('/v1/vaults', { name: 'sweep' });
  await create(`/v1/organizations/workspaces/${p.bootstrap.workspace_id}/principals`, { external_subject_id: 'sweep', principal_type: 'service', display_name: 'sweep' }, 'sweep-principal');
  otherWorkspace = String((await create(`/v1/organizations/${p.bootstrap.organization_id}/workspaces`, { name: 'sweep-other' }, 'sweep-ws')).id);
  const ws = `/v1/organizations/workspaces/${p.bootstrap.workspace_id}`;
  const principal = String(ids.get('prin'));
  await create(`/v1/principals/${principal}/access-credentials`, {}, 'sweep-credential');
  await create('/v1/permission-assignments', { principal_id: principal, target: { type: 'workspace', id: p.bootstrap.workspace_id }, actions: ['read'] });
  await create('/v1/action-policies', { effect: 'deny', tool: { kind: 'a2a', name: 'ListTasks' } });
  await create('/v1/skills', { files: [{ path: 'SKILL.md', content: '---\nname: sweep\ndescription: A sweep.\n---\n\nDo it.\n' }] });
  await create('/v1/projects', { name: 'sweep', files: [{ path: 'README.md', content_base64: Buffer.from('# sweep\n').toString('base64') }] });
  await create('/v1/webhook-endpoints', { url: 'https://hooks.example.com/sweep' });
  // The automation's firing starts a Session of its own Agent when it is taken up, at a time of its choosing.
  const automationAgent = String((await send('POST', '/v1/agents', {}, JSON.stringify({ name: 'sweep-automation', model: 'default' })).then((a) => JSON.parse(a.text) as Json)).id);
  const automation = String((await create('/v1/automations', { name: 'sweep', principal_id: principal, agent: automationAgent, environment_id: envId, prompt: 'handle {{event}}', trigger: { type: 'webhook' } })).id);
  await create(`/v1/automations/${automation}/fire`, { event: { n: 1 } });
  await create(`${ws}/harness-profiles`, { key: 'default', kind: 'builtin' });
  await create(`${ws}/sandbox-profiles`, { key: 'default', image: 'agentplane/sandbox:latest' });
  await create(`${ws}/agent-deployments`, { agent_id: agentId, key: 'sweep' });
  const exti = String((await create('/v1/external-installations', { provider: 'slack', external_id: 'T-SWEEP', display_name: 'Sweep' })).id);
  const scope = String((await create('/v1/surface-scopes', { kind: 'root', external_installation_id: exti, display_name: 'Sweep' })).id);
  await create('/v1/agent-installations', { agent: { id: agentId }, environment_id: envId, surface_scope_ids: [scope] });
  const boundary = 'sweepBoundary';
  const upload = await send('POST', '/v1/files', { 'content-type': `multipart/form-data; boundary=${boundary}` },
    `--${boundary}\r\nContent-Disposition: form-data; name="file"; filename="a.txt"\r\nContent-Type: text/plain\r\n\r\nhello\r\n--${boundary}--\r\n`);
  expect(upload.status, upload.text).toBe(201);
  harvest(JSON.parse(upload.text) as unknown);
  await create(`/v1/sessions/${String(ids.get('sess'))}/resources`, { type: 'file', file_id: ids.get('file') });

  // The ids the listing and reading operations show, read one after another in the document's
  // order (the first id of a prefix is kept), twice: a second pass reaches what the first found.
  const reads = ops.filter((op) => op.method === 'GET' && !op.stream && !op.anonymous && !op.path.endsWith('/content') && op.path !== '/v1/openapi.json');
  for (let pass = 0; pass < 2; pass++) {
    for (const op of reads) {
      const { path, real } = fill(op);
      if (!real) continue;
      const a = await send('GET', `${path}${requiredQuery(op)}`);
      if (a.status === 200 && a.contentType.includes('json')) harvest(JSON.parse(a.text) as unknown);
    }
  }
}, 90_000);

afterAll(async () => {
  connections?.destroy();
  await p?.stop();
});

describe('contract sweep: every operation refuses malformed requests with a catalog error', () => {
  it('the document lists the operations to sweep', () => {
    expect(ops.length).toBeGreaterThan(200);
    for (const prefix of ['agent', 'env', 'sess', 'sthr', 'memstore', 'vlt', 'prin', 'wrkspc', 'org']) expect(ids.has(prefix), prefix).toBe(true);
  });

  it('malformed path ids, query parameters, bodies, content types and Idempotency-Keys are 4xx catalog errors', async () => {
    const probes = ops.flatMap(probesOf);
    const failures: string[] = [];
    await inPool(probes, IN_FLIGHT, async (probe) => {
      const answer = await send(probe.method, probe.path, probe.headers, probe.body);
      const wrong = judge(answer, probe.expect);
      if (wrong) failures.push(`${probe.op.id} (${probe.method} ${probe.path.slice(0, 100)}) ${probe.what}: ${wrong}`);
    });
    expect(probes.length).toBeGreaterThan(3000);
    expect(failures.sort(), `${failures.length} of ${probes.length} malformed requests were answered wrongly`).toEqual([]);
    // No malformed request was carried out: the resources the probes named are all still there.
    for (const [prefix, path] of FIXTURES) {
      const a = await send('GET', path.replace('{id}', ids.get(prefix) ?? ''));
      expect([prefix, a.status], a.text.slice(0, 200)).toEqual([prefix, 200]);
    }
  }, 120_000);

  it('values at the edge of what reads accept are answered, or refused with a catalog error: never a 5xx', async () => {
    const probes: Probe[] = [];
    for (const op of ops.filter((o) => o.method === 'GET' && !o.stream)) {
      const filled = fill(op);
      for (const param of op.parameters.filter((x) => x.in === 'query')) {
        for (const value of edgeQueryValues(param.schema)) {
          probes.push({ op, what: `query ${param.name}=${value.slice(0, 24)}`, method: 'GET', path: `${filled.path}${requiredQuery(op, param.name, `${param.name}=${value}`)}`, expect: Object.keys(CATALOG) });
        }
      }
    }
    const failures: string[] = [];
    await inPool(probes, IN_FLIGHT, async (probe) => {
      const answer = await send(probe.method, probe.path);
      const wrong = answer.status < 300 ? undefined : judge(answer, probe.expect);
      if (wrong) failures.push(`${probe.op.id} (${probe.method} ${probe.path.slice(0, 100)}) ${probe.what}: ${wrong}`);
    });
    expect(probes.length).toBeGreaterThan(200);
    expect(failures.sort()).toEqual([]);
  });

  it('an id of another workspace is absent, on every read that names one', async () => {
    const reads = ops.filter((op) => op.method === 'GET' && !op.stream && !op.anonymous
      && op.parameters.some((x) => x.in === 'path' && WORKSPACE_OWNED.has(idPrefixOf(x.schema) ?? ''))
      && !op.parameters.some((x) => x.in === 'path' && (x.name === 'workspace_id' || x.name === 'organization_id')));
    const failures: string[] = [];
    let sent = 0;
    await inPool(reads, IN_FLIGHT, async (op) => {
      const { path, real } = fill(op);
      if (!real) return;
      sent++;
      const wrong = judge(await send('GET', `${path}${requiredQuery(op)}`, { 'service-workspace-id': otherWorkspace }), ['validation.not_found']);
      if (wrong) failures.push(`${op.id} (GET ${path}): ${wrong}`);
    });
    expect(sent).toBeGreaterThan(20);
    expect(failures.sort()).toEqual([]);
  });

  it('an Idempotency-Key replays the same create, refuses another body, and is checked before anything is made', async () => {
    const creates: Array<[string, () => Json, () => Json]> = [
      ['/v1/agents', () => ({ name: 'idem-a', model: 'default' }), () => ({ name: 'idem-b', model: 'default' })],
      ['/v1/environments', () => ({ name: 'idem-a', image: 'agentplane/sandbox:1' }), () => ({ name: 'idem-b', image: 'agentplane/sandbox:1' })],
      ['/v1/sessions', () => ({ agent: ids.get('agent'), environment_id: ids.get('env'), title: 'idem-a' }), () => ({ agent: ids.get('agent'), environment_id: ids.get('env'), title: 'idem-b' })],
      ['/v1/memory-stores', () => ({ name: 'idem-a' }), () => ({ name: 'idem-b' })],
      ['/v1/vaults', () => ({ name: 'idem-a' }), () => ({ name: 'idem-b' })],
      [`/v1/organizations/workspaces/${p.bootstrap.workspace_id}/principals`,
        () => ({ external_subject_id: 'idem-a', principal_type: 'service', display_name: 'a' }), () => ({ external_subject_id: 'idem-b', principal_type: 'service', display_name: 'b' })],
    ];
    for (const [path, first, other] of creates) {
      const key = `sweep-${path.split('/').pop() ?? ''}`;
      // A malformed key with a body that is fine: refused, and nothing is made.
      const listed = path === '/v1/sessions' ? `${path}?limit=100&agent_id=${String(ids.get('agent'))}` : path.includes('/principals') ? path : `${path}?limit=100`;
      const before = await send('GET', listed);
      for (const bad of ['k'.repeat(256), 'a key', 'caf\u00e9', '', 'tab\tkey']) {
        const a = await send('POST', path, { 'idempotency-key': bad }, JSON.stringify(other()));
        expect([path, JSON.stringify(bad), judge(a, MALFORMED)]).toEqual([path, JSON.stringify(bad), undefined]);
        expect(a.text).toContain('Idempotency-Key');
      }
      const after = await send('GET', listed);
      expect((JSON.parse(after.text) as { data: unknown[] }).data.length, path).toBe((JSON.parse(before.text) as { data: unknown[] }).data.length);

      const made = await send('POST', path, { 'idempotency-key': key }, JSON.stringify(first()));
      expect(made.status, made.text).toBe(201);
      const again = await send('POST', path, { 'idempotency-key': key }, JSON.stringify(first()));
      expect([path, again.status, (JSON.parse(again.text) as Json).id]).toEqual([path, 201, (JSON.parse(made.text) as Json).id]);
      const conflict = await send('POST', path, { 'idempotency-key': key }, JSON.stringify(other()));
      expect([path, judge(conflict, ['idempotency.conflict'])]).toEqual([path, undefined]);
      // Another body that is malformed is refused as malformed (validation comes before the key).
      const malformed = await send('POST', path, { 'idempotency-key': key }, JSON.stringify({ ...other(), zz_unknown: 1 }));
      expect([path, judge(malformed, MALFORMED)]).toEqual([path, undefined]);
    }
  });
});
