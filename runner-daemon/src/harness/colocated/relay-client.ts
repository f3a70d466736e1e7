/**
 * The harness's end of the stdio relay: a `ModelClient` whose steps are `model.request` lines
 * answered by the runner's model gateway, MCP tool calls through the runner, the events sink,
 * and the abort signal the runner's `abort` line sets. The runner is trusted here; its lines are
 * parsed, not policed.
 */
import type { ModelClient, ModelRequest, ModelStreamEvent } from '@agentplane/protocol';
import type { HarnessEvent, SessionEventSink } from '../events.js';
import type { GateDecision, GateQuery } from '../loop.js';
import { encodeLine, RelayError, STOPPED_DECISION, type HarnessMessage, type RelayRun, type RunnerMessage } from './protocol.js';

/** Largest File the harness sends the runner (its base64 must fit one relay line). */
const MAX_RELAYED_FILE_BYTES = 2.5 * 1024 * 1024;

interface OpenStream {
  push(event: ModelStreamEvent | undefined): void;
}

export class RelayClient {
  private seq = 0;
  private readonly streams = new Map<string, OpenStream>();
  private readonly calls = new Map<string, (r: { content: string; is_error: boolean }) => void>();
  private readonly checks = new Map<string, (d: GateDecision) => void>();
  private readonly files = new Map<string, (r: { file_id?: string; error?: string }) => void>();
  private readonly aborter = new AbortController();
  private startRun!: (run: RelayRun) => void;
  /** The Run to execute, from the runner's `start` line. */
  readonly started = new Promise<RelayRun>((resolve) => (this.startRun = resolve));
  /** Aborted by the runner's `abort` line (`user.interrupt`, lease lost). */
  readonly signal: AbortSignal = this.aborter.signal;

  constructor(private readonly write: (line: string) => void) {}

  send(message: HarnessMessage): void {
    this.write(encodeLine(message));
  }

  /** One line from the runner. */
  receive(line: string): void {
    let m: RunnerMessage;
    try {
      m = JSON.parse(line) as RunnerMessage;
    } catch {
      throw new RelayError('not_json', 'the runner wrote a line that is not JSON');
    }
    switch (m.type) {
      case 'start':
        this.startRun(m.run);
        break;
      case 'model.event':
        this.streams.get(m.id)?.push(m.event);
        break;
      case 'model.end':
        this.streams.get(m.id)?.push(undefined);
        break;
      case 'tool.result':
        this.calls.get(m.id)?.({ content: m.content, is_error: m.is_error });
        this.calls.delete(m.id);
        break;
      case 'file.stored':
        this.files.get(m.id)?.({ ...(m.file_id ? { file_id: m.file_id } : {}), ...(m.error ? { error: m.error } : {}) });
        this.files.delete(m.id);
        break;
      case 'tool.decision':
        this.checks.get(m.id)?.({ decision: m.decision, rule_id: m.rule_id, message: m.message });
        this.checks.delete(m.id);
        break;
      case 'abort':
        this.aborter.abort(m.reason);
        for (const [id, answer] of this.checks) {
          this.checks.delete(id);
          answer(STOPPED_DECISION);
        }
        break;
      default:
        throw new RelayError('invalid_message', 'unknown message from the runner');
    }
  }

  /** Events go to the runner, which validates and appends them; the idle status is its to derive. */
  readonly sink: SessionEventSink = {
    emit: async (event: HarnessEvent) => {
      if (event.type === 'session.status_idle') return;
      this.send({ type: 'event', event: { type: event.type, payload: event.payload } as Exclude<HarnessEvent, { type: 'session.status_idle' }> });
    },
  };

  readonly model: ModelClient = {
    stream: (request: ModelRequest, signal: AbortSignal) => this.stream(request, signal),
  };

  private async *stream(request: ModelRequest, signal: AbortSignal): AsyncIterable<ModelStreamEvent> {
    const id = `m${++this.seq}`;
    const queue: Array<ModelStreamEvent | undefined> = [];
    let wake: (() => void) | undefined;
    this.streams.set(id, {
      push(event) {
        queue.push(event);
        wake?.();
      },
    });
    const onAbort = (): void => {
      this.send({ type: 'model.cancel', id });
      queue.push({ type: 'error', error: { type: 'runtime.internal', message: 'the model step was canceled', retryable: false } });
      wake?.();
    };
    signal.addEventListener('abort', onAbort, { once: true });
    try {
      this.send({ type: 'model.request', id, request });
      for (;;) {
        while (queue.length > 0) {
          const event = queue.shift();
          if (event === undefined) return;
          yield event;
          if (event.type === 'end' || event.type === 'error') return;
        }
        await new Promise<void>((resolve) => (wake = resolve));
        wake = undefined;
      }
    } finally {
      signal.removeEventListener('abort', onAbort);
      this.streams.delete(id);
    }
  }

  /**
   * The ActionPolicy check of one tool use, asked of the runner (which asks the control plane;
   * name and input are the runner's own record of the model's tool use, so only the id travels).
   */
  checkTool(q: GateQuery): Promise<GateDecision> {
    const id = `c${++this.seq}`;
    return new Promise((resolve) => {
      if (this.signal.aborted) {
        resolve(STOPPED_DECISION);
        return;
      }
      this.checks.set(id, resolve);
      this.send({ type: 'tool.check', id, tool_use_id: q.tool_use_id });
    });
  }

  /**
   * Stores a screenshot as a File of the Session through the runner (the sandbox has no
   * network). `tool_use_id` is the `browser_screenshot` use it answers.
   */
  async storeFile(file: { filename: string; content_type: 'image/png'; data: Buffer; tool_use_id: string }): Promise<{ file_id: string }> {
    // A relay line holds 4 MiB: the base64 of a larger screenshot would break it.
    if (file.data.length > MAX_RELAYED_FILE_BYTES) throw new Error(`the screenshot (${file.data.length} bytes) is larger than the ${MAX_RELAYED_FILE_BYTES} bytes a relay line carries`);
    const id = `f${++this.seq}`;
    const r = await new Promise<{ file_id?: string; error?: string }>((resolve) => {
      this.files.set(id, resolve);
      this.send({ type: 'file.store', id, tool_use_id: file.tool_use_id, filename: file.filename, content_type: file.content_type, data: file.data.toString('base64') });
    });
    if (!r.file_id) throw new Error(r.error ?? 'the runner did not store the File');
    return { file_id: r.file_id };
  }

  /** Calls an MCP tool through the runner (the sandbox has no network). */
  callTool(toolUseId: string, name: string, input: unknown, signal: AbortSignal): Promise<{ content: string; is_error: boolean }> {
    // Interrupted before it was asked for (the signal's event has fired already): not sent at all.
    if (signal.aborted) return Promise.resolve({ content: 'Interrupted before the tool ran.', is_error: true });
    const id = `t${++this.seq}`;
    return new Promise((resolve) => {
      const onAbort = (): void => {
        this.calls.delete(id);
        resolve({ content: 'Interrupted before the tool finished.', is_error: true });
      };
      signal.addEventListener('abort', onAbort, { once: true });
      this.calls.set(id, (r) => {
        signal.removeEventListener('abort', onAbort);
        resolve(r);
      });
      this.send({ type: 'tool.call', id, tool_use_id: toolUseId, name, input });
    });
  }
}
