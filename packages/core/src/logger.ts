import { pino, type DestinationStream, type Logger, type LevelWithSilent } from 'pino';

export type { Logger };

export interface LoggerOptions {
  name: string;
  level?: LevelWithSilent;
  /** Where lines go; stdout by default. */
  destination?: DestinationStream;
  /**
   * Lines to stdout are written before the call that logs them returns (pino's default writes
   * them a moment later, from Node's thread pool). For a process whose children share its stdout
   * and must not be heard before it: the platform, whose stop lines say why its children stop.
   */
  sync?: boolean;
}

/**
 * Field names whose values are secrets, compared lower-cased with `-` read as `_` (so header
 * names match too): API-key and credential secrets, the root key, bearer and upstream tokens,
 * authorization headers, sealed secrets, repository passwords.
 */
export const SECRET_FIELD_NAMES: ReadonlySet<string> = new Set([
  'secret', 'secrets', 'client_secret', 'sealed_secret', 'root_key', 'private_key',
  'authorization', 'proxy_authorization', 'cookie', 'set_cookie',
  'credential', 'credentials', 'api_key', 'apikey', 'x_api_key',
  'token', 'access_token', 'refresh_token', 'id_token', 'bearer',
  'password', 'passphrase',
]);

/** A string field named `<anything>_token`, `_secret`, … is a secret too (`upstream_token`). */
const SECRET_SUFFIXES = ['_secret', '_token', '_password', '_api_key'];

const CENSOR = '[redacted]';
/** Deeper than this, a logged value is replaced (a guard against pathological objects). */
const MAX_DEPTH = 32;

function isSecretField(key: string, value: unknown): boolean {
  const k = key.toLowerCase().replace(/-/g, '_');
  if (SECRET_FIELD_NAMES.has(k)) return true;
  return typeof value === 'string' && SECRET_SUFFIXES.some((s) => k.endsWith(s));
}

const serializeError = pino.stdSerializers.err;

function walk(value: unknown, depth: number, ancestors: object[]): unknown {
  if (typeof value !== 'object' || value === null) return value;
  if (ancestors.includes(value)) return '[Circular]';
  if (depth >= MAX_DEPTH) return '[too deep]';
  // An Error becomes its pino serialisation (type, message, stack, code and its other own
  // fields), walked like any object: its fields can hold secrets too.
  if (value instanceof Error) return walkObject(serializeError(value) as object, depth, ancestors, true);
  // Dates, Buffers and the like serialise themselves.
  if (typeof (value as { toJSON?: unknown }).toJSON === 'function') return value;
  if (Array.isArray(value)) {
    ancestors.push(value);
    let out: unknown[] | null = null;
    for (let i = 0; i < value.length; i++) {
      const v: unknown = value[i];
      const w = walk(v, depth + 1, ancestors);
      if (w !== v && out === null) out = value.slice(0, i);
      if (out !== null) out.push(w);
    }
    ancestors.pop();
    return out ?? value;
  }
  return walkObject(value, depth, ancestors, false);
}

/** The object itself when nothing in it changes; a plain copy otherwise (or when `copy`). */
function walkObject(obj: object, depth: number, ancestors: object[], copy: boolean): unknown {
  ancestors.push(obj);
  const record = obj as Record<string, unknown>;
  let out: Record<string, unknown> | null = copy ? {} : null;
  const keys = Object.keys(record);
  for (let i = 0; i < keys.length; i++) {
    const key = keys[i] as string;
    const v = record[key];
    const w = isSecretField(key, v) && v !== undefined && v !== null ? CENSOR : walk(v, depth + 1, ancestors);
    if (w !== v && out === null) {
      out = {};
      for (let j = 0; j < i; j++) out[keys[j] as string] = record[keys[j] as string];
    }
    if (out !== null) out[key] = w;
  }
  ancestors.pop();
  return out ?? obj;
}

/**
 * `value` with every secret-named field (see SECRET_FIELD_NAMES) censored at any depth, Errors
 * serialised, cycles cut. Parts without a secret are shared with the input, never mutated.
 */
export function redactSecrets<T>(value: T): T {
  return walk(value, 0, []) as T;
}

/**
 * Structured JSON logs on stdout. Secrets are redacted by field name at every depth of what is
 * logged (the merged object and child bindings); everything else, `code` included (exit codes,
 * `ECONNREFUSED`), is logged as is.
 */
export function createLogger(options: LoggerOptions): Logger {
  const opts = {
    name: options.name,
    level: options.level ?? 'info',
    base: { service: options.name, pid: process.pid },
    timestamp: pino.stdTimeFunctions.isoTime,
    formatters: { log: (obj: Record<string, unknown>) => redactSecrets(obj) },
    // Errors are already serialised (and redacted) by the formatter; a plain object passes.
    serializers: { err: (e: unknown): unknown => (e instanceof Error ? redactSecrets(serializeError(e)) : e) },
  };
  const destination = options.destination ?? (options.sync ? pino.destination({ dest: process.stdout.fd ?? 1, sync: true }) : undefined);
  const root = destination ? pino(opts, destination) : pino(opts);
  // Child bindings skip the log formatter: redact them on the way in. Children inherit this
  // `child` (they are prototype-linked to the root), so grandchildren are covered too.
  const protoChild = root.child as unknown as (this: Logger, bindings: Record<string, unknown>, o?: object) => Logger;
  Object.defineProperty(root, 'child', {
    value: function redactingChild(this: Logger, bindings: Record<string, unknown>, o?: object): Logger {
      return protoChild.call(this, redactSecrets(bindings), o);
    },
    writable: true,
    configurable: true,
  });
  return root;
}
