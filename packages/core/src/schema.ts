import { Ajv, type ErrorObject, type ValidateFunction } from 'ajv';
import addFormatsImport from 'ajv-formats';
import { Type, type TSchema, type Static, type TProperties, type ObjectOptions, type TObject } from '@sinclair/typebox';
import { INTEGER_TEXT } from './config.js';
import { ApiError } from './errors.js';
import { idPattern, type IdKind, LOGICAL_KEY_PATTERN, CURSOR_PATTERN } from './ids.js';

export { Type };
export type { TSchema, Static };

// ajv-formats ships CJS with a default export; normalise for NodeNext.
const addFormats = addFormatsImport as unknown as (ajv: Ajv) => Ajv;

function makeAjv(coerce: boolean): Ajv {
  const ajv = new Ajv({
    allErrors: false,
    strict: true,
    strictRequired: false,
    coerceTypes: coerce ? 'array' : false,
    useDefaults: true,
    removeAdditional: false,
    allowUnionTypes: true,
  });
  addFormats(ajv);
  // RFC 3339 admits a leap second (`23:59:60`), which JavaScript's Date cannot read (NaN): a
  // date-time is one that is both, so no handler is given a time it cannot compare or store.
  const rfc3339 = ajv.formats['date-time'] as { validate: (s: string) => boolean; compare?: (a: string, b: string) => number | undefined };
  ajv.addFormat('date-time', { type: 'string', validate: (s: string) => rfc3339.validate(s) && Number.isFinite(Date.parse(s)), ...(rfc3339.compare ? { compare: rfc3339.compare } : {}) });
  ajv.addKeyword('kind').addKeyword('modifier'); // TypeBox's symbols-as-keywords when serialised
  ajv.addKeyword('x-internal');
  // `Patch`'s fields that change something: at least one of them is set.
  ajv.addKeyword({ keyword: 'x-changes', type: 'object', schemaType: 'array', validate: (fields: string[], data: Record<string, unknown>) => fields.some((f) => Object.hasOwn(data, f)) });
  return ajv;
}

/** Bodies: no coercion. Query and path: strings are coerced to the declared type. */
const bodyAjv = makeAjv(false);
const paramAjv = makeAjv(true);
const cache = new WeakMap<TSchema, ValidateFunction>();
const paramCache = new WeakMap<TSchema, ValidateFunction>();

export type RequestPart = 'body' | 'query' | 'path' | 'header' | 'message' | 'config';

const literal = (v: unknown): string => (typeof v === 'string' ? `'${v}'` : JSON.stringify(v));

function describe(part: string, e: ErrorObject): string {
  const where = `${part}${e.instancePath.replace(/\//g, '.')}`;
  if (e.propertyName !== undefined) {
    const name = e.propertyName.length > 40 ? `${e.propertyName.slice(0, 40)}…` : e.propertyName;
    return `${where}: the key '${name}' ${e.message ?? 'is invalid'}`;
  }
  if (e.keyword === 'one_of_literals') return `${where}: must be one of ${(e.params as { allowed: unknown[] }).allowed.map(literal).join(', ')}`;
  if (e.keyword === 'enum') return `${where}: must be one of ${((e.params as { allowedValues?: unknown[] }).allowedValues ?? []).map(literal).join(', ')}`;
  if (e.keyword === 'const') return `${where}: must be ${literal((e.params as { allowedValue?: unknown }).allowedValue)}`;
  if (e.keyword === 'additionalProperties') {
    return `${where}: unknown field '${String((e.params as { additionalProperty: string }).additionalProperty)}'`;
  }
  if (e.keyword === 'pattern') return `${where}: does not match ${String((e.params as { pattern: string }).pattern)}`;
  if (e.keyword === 'required') {
    return `${where}: missing required field '${String((e.params as { missingProperty: string }).missingProperty)}'`;
  }
  if (e.keyword === 'at_least_one_of') return `${where}: nothing to change: set at least one of ${(e.params as { fields: string[] }).fields.map(literal).join(', ')}`;
  return `${where}: ${e.message ?? 'is invalid'}`;
}

type Json = Record<string, unknown>;
const isObject = (v: unknown): v is Json => typeof v === 'object' && v !== null && !Array.isArray(v);

/** What a JSON pointer (`#/a/0/b`, `/a/0/b`) names in `root`; undefined when nothing. */
function at(root: unknown, pointer: string): unknown {
  let node = root;
  for (const raw of pointer.replace(/^#/, '').split('/').slice(1)) {
    const key = raw.replace(/~1/g, '/').replace(/~0/g, '~');
    if (Array.isArray(node)) node = node[Number(key)];
    else if (isObject(node)) node = node[key];
    else return undefined;
  }
  return node;
}

/**
 * The error that says what is wrong, out of what a failed union (`anyOf`, `oneOf`) reports: one
 * error per alternative tried, then the union's own. The alternative meant is one whose
 * constant properties (a `type` or `mode` discriminator) the value carries, and of several such
 * (or of all, when none) the one whose JSON type the value has and that got furthest into it. A union of constants is one error
 * listing them. Any other failure is reported as ajv found it first.
 */
export function explainErrors(errors: readonly ErrorObject[], schema: unknown, value: unknown): ErrorObject | undefined {
  const union = errors.at(-1);
  if (!union || (union.keyword !== 'anyOf' && union.keyword !== 'oneOf')) return errors[0];
  const prefix = `${union.schemaPath}/`;
  const branches = at(schema, union.schemaPath);
  if (!Array.isArray(branches)) return errors[0];
  const byBranch = new Map<number, ErrorObject[]>();
  for (const e of errors.slice(0, -1)) {
    if (!e.schemaPath.startsWith(prefix)) continue;
    const i = Number(e.schemaPath.slice(prefix.length).split('/')[0]);
    if (!byBranch.has(i)) byBranch.set(i, []);
    byBranch.get(i)?.push(e);
  }
  if (byBranch.size === 0) return errors[0];
  const v = at(value, union.instancePath === '' ? '' : `#${union.instancePath}`);
  const consts = branches.map((b) => (isObject(b) && 'const' in b ? { value: b.const } : undefined));
  if (consts.every((c) => c !== undefined)) {
    return { ...union, keyword: 'one_of_literals', params: { allowed: consts.map((c) => c?.value) }, message: 'must be one of the allowed values' };
  }
  const pick = (i: number): ErrorObject | undefined => {
    const own = byBranch.get(i);
    return own && own.length > 0 ? explainErrors(own, schema, value) : undefined;
  };
  // The discriminated alternatives: every constant property they declare has the value's value.
  const claimed = isObject(v)
    ? [...byBranch.keys()].filter((i) => {
      const b = branches[i] as unknown;
      const props = isObject(b) && isObject(b.properties) ? Object.entries(b.properties) : [];
      const fixed = props.filter(([, p]) => isObject(p) && 'const' in p);
      return fixed.length > 0 && fixed.every(([k, p]) => v[k] === (p as Json).const);
    })
    : [];
  // None claimed, though every alternative is an object told apart by one constant property (a
  // `type`): that property is what is wrong, missing or none of the alternatives' values.
  if (claimed.length === 0 && isObject(v)) {
    const wrong = discriminatorError(branches, v, union.instancePath);
    if (wrong) return { ...union, ...wrong };
  }
  // Of those (else of all), the alternative of the value's JSON type that got the furthest.
  let best: { error: ErrorObject; depth: number } | undefined;
  for (const i of (claimed.length > 0 ? claimed : [...byBranch.keys()]).sort((a, b) => a - b)) {
    const e = pick(i);
    if (!e) continue;
    const wrongType = e.keyword === 'type' && e.instancePath === union.instancePath;
    const depth = wrongType ? -1 : e.instancePath.split('/').length;
    if (!best || depth > best.depth) best = { error: e, depth };
  }
  return best?.error ?? errors[0];
}

/**
 * Of a union whose every alternative is an object with a constant property `k` (its
 * discriminator), the error of a value that lacks `k` or whose `k` is none of the constants.
 */
function discriminatorError(branches: unknown[], v: Json, path: string): Pick<ErrorObject, 'keyword' | 'params' | 'instancePath'> | undefined {
  const constsOf = (b: unknown): [string, unknown][] =>
    isObject(b) && isObject(b.properties) ? Object.entries(b.properties).filter(([, p]) => isObject(p) && 'const' in p).map(([k, p]) => [k, (p as Json).const]) : [];
  const first = constsOf(branches[0]).map(([k]) => k);
  const key = first.find((k) => branches.every((b) => constsOf(b).some(([bk]) => bk === k)));
  if (key === undefined) return undefined;
  if (!(key in v)) return { keyword: 'required', params: { missingProperty: key }, instancePath: path };
  const allowed = [...new Set(branches.map((b) => constsOf(b).find(([k]) => k === key)?.[1]))];
  if (allowed.some((a) => a === v[key])) return undefined;
  return { keyword: 'one_of_literals', params: { allowed }, instancePath: `${path}/${key}` };
}

/**
 * A failed `minProperties` as what it means: a required field missing (ajv checks the count
 * first), else an object that sets none of the fields it must set one of (a patch that changes
 * nothing), naming them.
 */
function minPropertiesError(e: ErrorObject, schema: unknown, value: unknown): ErrorObject {
  const object = at(schema, e.schemaPath.replace(/\/minProperties$/, ''));
  const v = at(value, e.instancePath === '' ? '' : `#${e.instancePath}`);
  if (!isObject(object) || !isObject(object.properties) || !isObject(v)) return e;
  const required = Array.isArray(object.required) ? object.required.filter((k): k is string => typeof k === 'string') : [];
  const missing = required.find((k) => !(k in v));
  if (missing !== undefined) return { ...e, keyword: 'required', params: { missingProperty: missing } };
  const fields = Object.keys(object.properties).filter((k) => !required.includes(k));
  return fields.length > 0 ? { ...e, keyword: 'at_least_one_of', params: { fields } } : e;
}

/**
 * A copy of `schema` in which every integer is a safe one: a number past 2^53 cannot be told
 * from its neighbours, and one sent in exponent form would reach storage as such.
 */
function withSafeIntegers(schema: unknown): unknown {
  if (Array.isArray(schema)) return schema.map(withSafeIntegers);
  if (!isObject(schema)) return schema;
  const out: Json = {};
  for (const [k, v] of Object.entries(schema)) out[k] = k === 'const' || k === 'enum' || k === 'default' || k === 'examples' ? v : withSafeIntegers(v);
  const type = out.type;
  if (type === 'integer' || (Array.isArray(type) && type.includes('integer'))) {
    out.maximum = Math.min(typeof out.maximum === 'number' ? out.maximum : Number.MAX_SAFE_INTEGER, Number.MAX_SAFE_INTEGER);
    out.minimum = Math.max(typeof out.minimum === 'number' ? out.minimum : Number.MIN_SAFE_INTEGER, Number.MIN_SAFE_INTEGER);
  }
  return out;
}

/** A number as a parameter may write it: an integer as a setting is written, with an optional fraction. */
const NUMBER_TEXT = /^-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?$/;

type NumeralCheck = (value: unknown, where: string) => void;
const numeralChecks = new WeakMap<TSchema, NumeralCheck | undefined>();

/**
 * For a schema whose values arrive as text (query, path, headers, settings): a check that each
 * number is written as one, before ajv's coercion reads it with `+text`, which also takes
 * `Infinity`, `1e400`, `0x10` and ` 5`. Undefined where the schema takes no number. Numbers
 * inside a union are not reached (no parameter schema has one).
 */
function numeralCheck(schema: unknown): NumeralCheck | undefined {
  if (!isObject(schema)) return undefined;
  const types = Array.isArray(schema.type) ? schema.type : [schema.type];
  if (!types.includes('string') && (types.includes('integer') || types.includes('number'))) {
    const [pattern, noun] = types.includes('integer') ? [INTEGER_TEXT, 'an integer'] : [NUMBER_TEXT, 'a number'];
    return (value, where) => {
      if (typeof value === 'string' && !pattern.test(value)) throw new ApiError('validation.malformed', `${where}: must be ${noun} in decimal digits`);
    };
  }
  const checks: Array<[string, NumeralCheck]> = [];
  if (isObject(schema.properties)) {
    for (const [key, sub] of Object.entries(schema.properties)) {
      const check = numeralCheck(sub);
      if (check) checks.push([key, check]);
    }
  }
  const items = numeralCheck(schema.items);
  if (checks.length === 0 && !items) return undefined;
  return (value, where) => {
    if (items) {
      // A parameter given once arrives as a scalar that ajv wraps into the array.
      if (Array.isArray(value)) value.forEach((v, i) => items(v, `${where}.${i}`));
      else items(value, where);
    }
    if (!isObject(value)) return;
    for (const [key, check] of checks) if (value[key] !== undefined) check(value[key], `${where}.${key}`);
  };
}

/**
 * Compile once, validate many; rejects with `validation.malformed` naming the problem (where it
 * is: `label`, default the part's name, then the JSON path; of a failed union, the alternative
 * meant: `explainErrors`).
 */
export function validator<S extends TSchema>(schema: S, part: RequestPart = 'body', label: string = part): (value: unknown) => Static<S> {
  const coerce = part === 'query' || part === 'path' || part === 'header' || part === 'config';
  const store = coerce ? paramCache : cache;
  let fn = store.get(schema);
  if (!fn) {
    fn = (coerce ? paramAjv : bodyAjv).compile(withSafeIntegers(schema) as TSchema);
    store.set(schema, fn);
  }
  const compiled = fn;
  const compiledSchema = compiled.schema;
  let numerals: NumeralCheck | undefined;
  if (coerce) {
    if (!numeralChecks.has(schema)) numeralChecks.set(schema, numeralCheck(schema));
    numerals = numeralChecks.get(schema);
  }
  return (value: unknown): Static<S> => {
    numerals?.(value, label);
    if (compiled(value)) return value as Static<S>;
    let first = explainErrors(compiled.errors ?? [], compiledSchema, value);
    if (first?.keyword === 'minProperties') first = minPropertiesError(first, compiledSchema, value);
    else if (first?.keyword === 'x-changes') first = { ...first, keyword: 'at_least_one_of', params: { fields: at(compiledSchema, first.schemaPath) } };
    throw new ApiError('validation.malformed', first ? describe(label, first) : `${label} is invalid`);
  };
}

export function check<S extends TSchema>(schema: S, value: unknown, part: RequestPart = 'body'): Static<S> {
  return validator(schema, part)(value);
}

// ---- Schema building blocks shared by every route ----------------------------------------

/** A closed object: unknown fields are rejected. */
export function Obj<P extends TProperties>(properties: P, options: ObjectOptions = {}): TObject<P> {
  return Type.Object(properties, { additionalProperties: false, ...options });
}

/**
 * A closed object that must change something: a body setting only its compare-and-swap fields
 * (`expected_…`), or nothing, is refused as changing nothing, naming the fields it may set.
 */
export function Patch<P extends TProperties>(properties: P, options: ObjectOptions = {}): TObject<P> {
  return Obj(properties, { ...options, 'x-changes': Object.keys(properties).filter((k) => !k.startsWith('expected_')) });
}

export const Id = (kind: IdKind, description?: string) =>
  Type.String({ pattern: idPattern(kind), ...(description ? { description } : {}) });

export const LogicalKey = () => Type.String({ pattern: LOGICAL_KEY_PATTERN });
/** The most characters a list's own cursor may have (what its store writes). */
export const LIST_CURSOR_MAX = 512;
/** The characters the API appends to a list's own cursor to bind it to its list (api/src/http/page-binding.ts). */
export const CURSOR_TAG_LENGTH = 8;
/** A list cursor as the client sees it: the list's own and the tag that binds it to its list. */
export const Cursor = () => Type.String({ pattern: CURSOR_PATTERN, maxLength: LIST_CURSOR_MAX + CURSOR_TAG_LENGTH });
export const Timestamp = () => Type.String({ format: 'date-time' });
export const Nullable = <S extends TSchema>(s: S) => Type.Union([s, Type.Null()]);
/**
 * Up to 16 string pairs: keys of 1 to 64 characters, values up to 512. (A record's key schema
 * becomes a pattern that takes any key: the keys' bounds are `propertyNames`.)
 */
export const Metadata = () =>
  Type.Record(Type.String(), Type.String({ maxLength: 512 }), { maxProperties: 16, propertyNames: { type: 'string', minLength: 1, maxLength: 64 } });

/** Standard list query: `limit` (1..max) and `page`. */
export function PageQuery<P extends TProperties>(extra: P, maxLimit = 100, defaultLimit = 20) {
  return Obj({
    limit: Type.Optional(Type.Integer({ minimum: 1, maximum: maxLimit, default: defaultLimit })),
    page: Type.Optional(Cursor()),
    ...extra,
  });
}

export function Page<S extends TSchema>(item: S) {
  return Obj({ data: Type.Array(item), next_page: Nullable(Cursor()) });
}
