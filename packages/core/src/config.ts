import { parseArgs } from 'node:util';
import { ApiError } from './errors.js';

/**
 * Helpers for each process's config module: the only code that reads the environment.
 * Each process parses its environment once at its edge into a typed, frozen object.
 */
export type Env = Readonly<Record<string, string | undefined>>;

/**
 * The listen backlog of the platform's HTTP servers (api, gateway): connections the kernel
 * completes and queues before the process accepts them, capped by `net.core.somaxconn` (4096 on
 * current Linux), as Go's servers take it from the system. Node's default of 511 overflows when a
 * burst of clients connects while the process is busy: a connection the queue had no room for
 * waits on the kernel's SYN-ACK retries and, after about 30 s, is reset (`bench:dispatch` at
 * 1,000 Runs/s saw up to 4% of its messages reset that way on a slow machine, each before the api
 * read it), where a queued one is served as soon as the process gets to it.
 */
export const LISTEN_BACKLOG = 4096;

export class ConfigError extends Error {
  constructor(message: string) {
    super(message);
    this.name = 'ConfigError';
  }
}

export function envString(env: Env, name: string, fallback?: string): string {
  const v = env[name];
  if (v === undefined || v === '') {
    if (fallback === undefined) throw new ConfigError(`${name} is required`);
    return fallback;
  }
  return v;
}

export function envOptional(env: Env, name: string): string | undefined {
  const v = env[name];
  return v === undefined || v === '' ? undefined : v;
}

/**
 * The longest delay a Node timer takes (2^31 − 1 ms, about 24.8 days): a longer one fires after
 * 1 ms. Every integer setting is at most this by default, since most are durations or become one.
 */
export const MAX_TIMER_MS = 2_147_483_647;
/** The same bound for a setting in seconds. */
export const MAX_TIMER_SECONDS = Math.floor(MAX_TIMER_MS / 1000);

/** An integer as text that is read as one: decimal digits, no sign but `-`, no padding, exponent or radix. */
export const INTEGER_TEXT = /^-?(?:0|[1-9][0-9]*)$/;

/**
 * An integer setting, written in decimal digits (not `1e3`, `0x10` or ` 5`, which `Number` would
 * also read), from `min` to `max`.
 */
export function envInt(env: Env, name: string, fallback: number, min = 0, max = MAX_TIMER_MS): number {
  const raw = env[name];
  if (raw === undefined || raw === '') return fallback;
  const n = INTEGER_TEXT.test(raw) ? Number(raw) : NaN;
  if (!Number.isSafeInteger(n) || n < min || n > max) throw new ConfigError(`${name} must be an integer in [${min}, ${max}], got '${raw}'`);
  return n;
}

export function envBool(env: Env, name: string, fallback: boolean): boolean {
  const raw = env[name];
  if (raw === undefined || raw === '') return fallback;
  if (/^(1|true|yes|on)$/i.test(raw)) return true;
  if (/^(0|false|no|off)$/i.test(raw)) return false;
  throw new ConfigError(`${name} must be a boolean, got '${raw}'`);
}

/**
 * A boolean setting that has a deprecated former name: the current name wins, the former is read
 * when the current is unset (`aliased`), and both set to values that disagree is refused naming
 * both (which one was meant cannot be guessed).
 */
export function envBoolAliased(env: Env, name: string, deprecated: string, fallback: boolean): { value: boolean; aliased: boolean } {
  const current = envOptional(env, name) === undefined ? undefined : envBool(env, name, fallback);
  const former = envOptional(env, deprecated) === undefined ? undefined : envBool(env, deprecated, fallback);
  if (current !== undefined && former !== undefined && current !== former) {
    throw new ConfigError(`${name}='${env[name] ?? ''}' and its deprecated alias ${deprecated}='${env[deprecated] ?? ''}' disagree; set ${name} only`);
  }
  return { value: current ?? former ?? fallback, aliased: current === undefined && former !== undefined };
}

export function envEnum<T extends string>(env: Env, name: string, values: readonly T[], fallback: T): T {
  const raw = env[name];
  if (raw === undefined || raw === '') return fallback;
  if ((values as readonly string[]).includes(raw)) return raw as T;
  throw new ConfigError(`${name} must be one of ${values.join(', ')}, got '${raw}'`);
}

export { ApiError };

/**
 * A process's command line, parsed strictly: `--help`/`-h` and the boolean `flags` given, nothing
 * else. An unknown flag or a stray argument is one line on stderr (`<name>: …`), the usage, and
 * exit code 2: a typo never starts a process with settings it did not mean.
 */
export function strictCommandLine(name: string, usage: string, argv: readonly string[], flags: readonly string[] = []): { help: boolean; flags: Set<string> } {
  try {
    const options: Record<string, { type: 'boolean'; short?: string }> = { help: { type: 'boolean', short: 'h' } };
    for (const f of flags) options[f] = { type: 'boolean' };
    const { values } = parseArgs({ args: [...argv], strict: true, allowPositionals: false, options });
    return { help: values.help === true, flags: new Set(flags.filter((f) => values[f] === true)) };
  } catch (err) {
    const first = (err instanceof Error ? err.message : String(err)).split(/\.(?: |$)/)[0] ?? '';
    process.stderr.write(`${name}: ${first.charAt(0).toLowerCase()}${first.slice(1)}\n\n${usage}`);
    process.exit(2);
  }
}

/**
 * Reads a process's settings: whatever their parsing throws is a mistake in a setting (a file a
 * setting names included), a `ConfigError` (exit code 2, one line).
 */
export function readSettings<T>(load: () => T): T {
  try {
    return load();
  } catch (err) {
    throw err instanceof ConfigError ? err : new ConfigError(err instanceof Error ? err.message : String(err));
  }
}
