import { Ajv, type ErrorObject, type ValidateFunction } from 'ajv';
import addFormatsImport from 'ajv-formats';
import { Type, type TSchema, type Static, type TProperties, type ObjectOptions, type TObject } from '@sinclair/typebox';
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
  ajv.addKeyword('kind').addKeyword('modifier'); // TypeBox's symbols-as-keywords when serialised
  ajv.addKeyword('x-internal');
  return ajv;
}

/** Bodies: no coercion. Query and path: strings are coerced to the declared type. */
const bodyAjv = makeAjv(false);
const paramAjv = makeAjv(true);
const cache = new WeakMap<TSchema, ValidateFunction>();
const paramCache = new WeakMap<TSchema, ValidateFunction>();

export type RequestPart = 'body' | 'query' | 'path' | 'header' | 'message' | 'config';

function describe(part: string, e: ErrorObject): string {
  const where = `${part}${e.instancePath.replace(/\//g, '.')}`;
  if (e.keyword === 'additionalProperties') {
    return `${where}: unknown field '${String((e.params as { additionalProperty: string }).additionalProperty)}'`;
  }
  if (e.keyword === 'pattern') return `${where}: does not match ${String((e.params as { pattern: string }).pattern)}`;
  if (e.keyword === 'required') {
    return `${where}: missing required field '${String((e.params as { missingProperty: string }).missingProperty)}'`;
  }
  return `${where}: ${e.message ?? 'is invalid'}`;
}

/**
 * Compile once, validate many; rejects with `validation.malformed` naming the first problem
 * (where it is: `label`, default the part's name, then the JSON path).
 */
export function validator<S extends TSchema>(schema: S, part: RequestPart = 'body', label: string = part): (value: unknown) => Static<S> {
  const coerce = part === 'query' || part === 'path' || part === 'header' || part === 'config';
  const store = coerce ? paramCache : cache;
  let fn = store.get(schema);
  if (!fn) {
    fn = (coerce ? paramAjv : bodyAjv).compile(schema);
    store.set(schema, fn);
  }
  const compiled = fn;
  return (value: unknown): Static<S> => {
    if (compiled(value)) return value as Static<S>;
    const first = compiled.errors?.[0];
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

export const Id = (kind: IdKind, description?: string) =>
  Type.String({ pattern: idPattern(kind), ...(description ? { description } : {}) });

export const LogicalKey = () => Type.String({ pattern: LOGICAL_KEY_PATTERN });
export const Cursor = () => Type.String({ pattern: CURSOR_PATTERN, maxLength: 512 });
export const Timestamp = () => Type.String({ format: 'date-time' });
export const Nullable = <S extends TSchema>(s: S) => Type.Union([s, Type.Null()]);
export const Metadata = () =>
  Type.Record(Type.String({ minLength: 1, maxLength: 64 }), Type.String({ maxLength: 512 }), { maxProperties: 16 });

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
