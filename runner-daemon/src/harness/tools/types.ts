import type { ImageContent, ToolSpec } from '@agentplane/protocol';
import type { CommandRunner, ExecResult, Sandbox } from '../../sandbox/types.js';
import type { BrowserSession } from './browser-session.js';

/** Stores a File of the Session (a screenshot) and returns its id. */
export type FileStore = (file: { filename: string; content_type: 'image/png'; data: Buffer; tool_use_id: string }) => Promise<{ file_id: string }>;

export interface ToolContext {
  driver: CommandRunner;
  sandbox: Sandbox;
  signal?: AbortSignal;
  /** Upper bound for any command the tool runs (e.g. what remains of the Run's max duration). */
  maxTimeoutMs?: number;
  /** The tool use being run (what a stored File answers). */
  toolUseId?: string;
  /** The Run's browser, where the Environment has one (the `browser_*` tools need it). */
  browser?: BrowserSession;
  /** Where the `browser_screenshot` tool stores its PNG as a File of the Session. */
  storeFile?: FileStore;
}

export interface ToolOutcome {
  /** Text returned to the model as the `tool_result` content. */
  content: string;
  is_error: boolean;
  /** Images returned to the model beside `content` (a screenshot); never written to the event log. */
  images?: ImageContent[];
  /** Details for events and logs, never sent to the model. */
  meta?: {
    exitCode?: number;
    timedOut?: boolean;
    killed?: boolean;
    oomKilled?: boolean;
    truncated?: boolean;
    durationMs?: number;
    /** The File the tool stored (a screenshot): the event names it instead of carrying the bytes. */
    fileId?: string;
  };
}

export interface BuiltinTool {
  readonly spec: ToolSpec;
  run(ctx: ToolContext, input: unknown): Promise<ToolOutcome>;
}

/** The input did not match the tool's schema; reported to the model as an error result. */
export class ToolInputError extends Error {
  constructor(
    readonly tool: string,
    message: string,
  ) {
    super(message);
    this.name = 'ToolInputError';
  }
}

/** Default caps on what one tool call returns to the model. */
export const TOOL_LIMITS = {
  /** Characters of output returned to the model per call. */
  maxResultChars: 30_000,
  defaultTimeoutMs: 120_000,
  maxTimeoutMs: 600_000,
  /** Largest file `read`/`edit` load. */
  maxFileBytes: 10 * 1024 * 1024,
} as const;

type FieldKind = 'string' | 'number' | 'boolean';

/** Reads declared fields from an untrusted tool input, rejecting wrong types and unknown fields. */
export function fields<T extends Record<string, unknown>>(
  tool: string,
  input: unknown,
  shape: Record<keyof T & string, { kind: FieldKind; required?: boolean }>,
): T {
  if (typeof input !== 'object' || input === null || Array.isArray(input)) {
    throw new ToolInputError(tool, 'input must be an object');
  }
  const record = input as Record<string, unknown>;
  for (const key of Object.keys(record)) {
    if (!(key in shape)) throw new ToolInputError(tool, `unknown field '${key}'`);
  }
  for (const [key, rule] of Object.entries(shape)) {
    const value = record[key];
    if (value === undefined || value === null) {
      if (rule.required) throw new ToolInputError(tool, `'${key}' is required`);
      continue;
    }
    if (typeof value !== rule.kind || (rule.kind === 'number' && !Number.isFinite(value))) {
      throw new ToolInputError(tool, `'${key}' must be a ${rule.kind}`);
    }
  }
  return record as T;
}

export function clampTimeout(ctx: ToolContext, requested: number | undefined): number {
  const wanted = Math.min(Math.max(requested ?? TOOL_LIMITS.defaultTimeoutMs, 1), TOOL_LIMITS.maxTimeoutMs);
  return ctx.maxTimeoutMs !== undefined ? Math.max(1, Math.min(wanted, ctx.maxTimeoutMs)) : wanted;
}

export function capText(text: string, max: number = TOOL_LIMITS.maxResultChars): { text: string; truncated: boolean } {
  if (text.length <= max) return { text, truncated: false };
  return { text: `${text.slice(0, max)}\n… [truncated ${text.length - max} characters]`, truncated: true };
}

/**
 * A command's stdout and stderr within `max` characters together, each cut on its own: stderr
 * keeps up to a quarter (more when stdout leaves it room), stdout the rest.
 */
export function capStreams(stdout: string, stderr: string, max: number = TOOL_LIMITS.maxResultChars): { stdout: string; stderr: string; truncated: boolean } {
  if (stdout.length + stderr.length <= max) return { stdout, stderr, truncated: false };
  const errRoom = Math.max(Math.floor(max / 4), max - stdout.length);
  const err = capText(stderr, errRoom);
  const out = capText(stdout, Math.max(0, max - Math.min(stderr.length, errRoom)));
  return { stdout: out.text, stderr: err.text, truncated: out.truncated || err.truncated };
}

export function metaOf(res: ExecResult): NonNullable<ToolOutcome['meta']> {
  return {
    exitCode: res.exitCode,
    timedOut: res.timedOut,
    killed: res.killed,
    oomKilled: res.oomKilled,
    truncated: res.truncated,
    durationMs: res.durationMs,
  };
}

/** A failure of the command itself (timeout, interrupt, OOM), phrased for the model. */
export function failureNote(res: ExecResult, timeoutMs: number): string | undefined {
  if (res.oomKilled) return 'The command was killed: it exceeded the sandbox memory limit.';
  if (res.timedOut) return `The command timed out after ${timeoutMs} ms and was killed.`;
  if (res.killed) return 'The command was interrupted.';
  return undefined;
}
