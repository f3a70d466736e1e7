/**
 * The stdio relay between the runner and a colocated harness (the agent loop running inside the
 * sandbox, which has no network). One JSON object per line, UTF-8, `\n`-terminated, at most
 * `RELAY_MAX_LINE_BYTES` per line, in each direction:
 *
 *   harness → runner (stdout)                 runner → harness (stdin)
 *   ─────────────────────────                 ────────────────────────
 *                                             start {run}
 *   model.request {id, request}         ──►   forwarded to the lease's model gateway
 *                                       ◄──   model.event {id, event} …, model.end {id}
 *   model.cancel {id}
 *   tool.check {id, tool_use_id}        ──►   the control plane's ActionPolicy check (`tool.check`
 *                                             on the runner's socket) of that tool use, as the
 *                                             runner saw the model make it (name and input)
 *                                       ◄──   tool.decision {id, decision, rule_id, message}
 *   tool.call {id, tool_use_id, name, input}  ──►  an MCP tool, called by the runner
 *                                       ◄──   tool.result {id, content, is_error}
 *   file.store {id, tool_use_id, filename,    ──►  a browser screenshot, stored by the runner
 *     content_type, data (base64)}                 as a File of the Session
 *                                       ◄──   file.stored {id, file_id} | {id, error}
 *   event {event}                       ──►   validated, then appended to the Session log
 *   log {level, msg}
 *   done {outcome: {stop_reason}}   |   error {message}
 *                                       ◄──   abort {reason}
 *
 * Everything the harness writes is untrusted: the runner validates each line
 * (`./validate.ts`) before acting on it. Only node built-ins and types here: the harness bundle
 * includes this module.
 */
import type { ModelMessage, ModelRequest, ModelStreamEvent, ToolSpec } from '@agentplane/protocol';
import type { HarnessEvent, IdleStopReason, ToolPermission } from '../events.js';
import type { GateDecision, PendingResponses } from '../loop.js';

/** Largest line either side accepts (a model request carries the whole thread). */
export const RELAY_MAX_LINE_BYTES = 4 * 1024 * 1024;

/** Where the runner writes the harness bundle inside the sandbox (a tmpfs). */
export const HARNESS_SANDBOX_PATH = '/tmp/agentplane-harness.mjs';

/** A tool the colocated loop offers the model. MCP tools are called through the runner (`tool.call`). */
export type RelayTool =
  | { type: 'builtin'; name: string; permission?: ToolPermission }
  | { type: 'custom'; spec: ToolSpec }
  | { type: 'external'; spec: ToolSpec; permission?: ToolPermission; mcp?: { connection_id: string; tool: string } };

/** What the harness needs to run one Run: the `HarnessLoop.run` input, as data. */
export interface RelayRun {
  agent: { routing_key: string; system?: string; tools: RelayTool[]; max_steps?: number };
  history: ModelMessage[];
  responses?: PendingResponses;
  session_thread_id?: string;
  max_duration_seconds?: number;
  /** The Environment's browser: the harness drives Chromium inside the sandbox (browser image). */
  browser?: boolean;
}

/** Events a colocated harness may emit: what the split loop emits, less the idle status the runner derives. */
export type RelayEvent = Exclude<HarnessEvent, { type: 'session.status_idle' }>;

export type HarnessMessage =
  | { type: 'model.request'; id: string; request: ModelRequest }
  | { type: 'model.cancel'; id: string }
  | { type: 'tool.check'; id: string; tool_use_id: string }
  | { type: 'tool.call'; id: string; tool_use_id: string; name: string; input: unknown }
  | { type: 'file.store'; id: string; tool_use_id: string; filename: string; content_type: 'image/png'; data: string }
  | { type: 'event'; event: RelayEvent }
  | { type: 'log'; level: 'debug' | 'info' | 'warn' | 'error'; msg: string }
  | { type: 'done'; outcome: { stop_reason: IdleStopReason } }
  | { type: 'error'; message: string };

export type RunnerMessage =
  | { type: 'start'; run: RelayRun }
  | { type: 'model.event'; id: string; event: ModelStreamEvent }
  | { type: 'model.end'; id: string }
  | ({ type: 'tool.decision'; id: string } & GateDecision)
  | { type: 'tool.result'; id: string; content: string; is_error: boolean }
  | { type: 'file.stored'; id: string; file_id?: string; error?: string }
  | { type: 'abort'; reason: 'interrupted' | 'max_duration' };

/**
 * The decision on a tool use whose check had not been answered when the Run was stopped (`abort`):
 * both ends apply it, so the harness can answer the use as refused without waiting.
 */
export const STOPPED_DECISION: GateDecision = { decision: 'deny', rule_id: null, message: 'the Run was stopped before the policy check answered' };

/** A line that is not the relay protocol; the runner ends the Run with it as the reason. */
export class RelayError extends Error {
  constructor(
    readonly reason: 'line_too_long' | 'not_json' | 'invalid_message' | 'invalid_event' | 'protocol_violation',
    message: string,
  ) {
    super(message);
    this.name = 'RelayError';
  }
}

/** One message as a relay line. */
export function encodeLine(message: HarnessMessage | RunnerMessage): string {
  return `${JSON.stringify(message)}\n`;
}

/**
 * Splits a byte stream into lines without ever holding more than `maxBytes` of an unfinished
 * line: a longer line is an error, reported once, and the splitter stops.
 */
export class LineSplitter {
  private parts: Buffer[] = [];
  private size = 0;
  private failed = false;

  constructor(
    private readonly onLine: (line: string) => void,
    private readonly onError: (err: RelayError) => void,
    private readonly maxBytes: number = RELAY_MAX_LINE_BYTES,
  ) {}

  push(chunk: Buffer): void {
    if (this.failed) return;
    let from = 0;
    for (let nl = chunk.indexOf(10, from); nl !== -1; nl = chunk.indexOf(10, from)) {
      if (!this.take(chunk.subarray(from, nl))) return;
      const line = Buffer.concat(this.parts, this.size).toString('utf8');
      this.parts = [];
      this.size = 0;
      from = nl + 1;
      if (line.trim() !== '') this.onLine(line);
      if (this.failed) return;
    }
    this.take(chunk.subarray(from));
  }

  /** The stream ended: an unterminated last line is still a line. */
  end(): void {
    if (this.failed || this.size === 0) return;
    const line = Buffer.concat(this.parts, this.size).toString('utf8');
    this.parts = [];
    this.size = 0;
    if (line.trim() !== '') this.onLine(line);
  }

  /** Stops the splitter (after the consumer rejected a line). */
  stop(): void {
    this.failed = true;
    this.parts = [];
  }

  private take(piece: Buffer): boolean {
    if (piece.length === 0) return true;
    if (this.size + piece.length > this.maxBytes) {
      this.stop();
      this.onError(new RelayError('line_too_long', `a relay line is longer than ${this.maxBytes} bytes`));
      return false;
    }
    this.parts.push(piece);
    this.size += piece.length;
    return true;
  }
}
