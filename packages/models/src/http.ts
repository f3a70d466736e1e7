import type { EventSourceMessage } from 'eventsource-parser';
import { httpError, ProviderError } from './errors.js';
import { sseMessages } from './sse.js';

export const DEFAULT_TIMEOUT_MS = 60_000;

/** The most of a non-2xx response body read for its error message (the rest is dropped). */
export const ERROR_BODY_MAX_BYTES = 64 * 1024;

export interface PostSseOptions {
  /** Time allowed until the response headers, and between two messages that carry content. */
  timeoutMs?: number | undefined;
  /** Time allowed for the whole exchange, from the request to the last message (none by default). */
  deadlineMs?: number | undefined;
  /**
   * Whether a message carries content (output, usage, a stop, an error): only those re-arm the
   * idle timer, so a provider that only sends keep-alives (`ping`, empty chunks) still times
   * out. Every message counts when absent.
   */
  isContent?: ((m: EventSourceMessage) => boolean) | undefined;
}

/**
 * At most `maxBytes` of a response body (the rest is cancelled unread), and whether that many
 * were read (`full`: the body may have had more).
 */
async function boundedBody(res: Response, maxBytes: number): Promise<{ text: string; full: boolean }> {
  if (!res.body) return { text: '', full: false };
  const reader = res.body.getReader();
  const chunks: Uint8Array[] = [];
  let size = 0;
  try {
    while (size < maxBytes) {
      const { value, done } = await reader.read();
      if (done) break;
      const part = value.byteLength > maxBytes - size ? value.subarray(0, maxBytes - size) : value;
      chunks.push(part);
      size += part.byteLength;
    }
  } finally {
    await reader.cancel().catch(() => undefined);
  }
  return { text: new TextDecoder().decode(Buffer.concat(chunks)), full: size >= maxBytes };
}

/**
 * A response body as text, at most `maxBytes` of it (an error body can be anything a server
 * sends: only its beginning is read, the rest of the body is cancelled).
 */
export async function boundedText(res: Response, maxBytes = ERROR_BODY_MAX_BYTES): Promise<string> {
  return (await boundedBody(res, maxBytes)).text;
}

/**
 * One streaming HTTP exchange with a provider: POST JSON, then yield its SSE messages.
 * A watchdog aborts the request when the headers, or the next message that carries content,
 * take longer than `timeoutMs`, or the whole exchange longer than `deadlineMs` (→ `timeout`,
 * retryable). The caller's signal aborts the request (→ `canceled`). `options` may be the
 * idle timeout alone.
 */
export async function* postSse(
  provider: string,
  url: string,
  headers: Record<string, string>,
  body: unknown,
  signal: AbortSignal,
  options: PostSseOptions | number = {},
): AsyncGenerator<EventSourceMessage> {
  const opts: PostSseOptions = typeof options === 'number' ? { timeoutMs: options } : options;
  const timeoutMs = opts.timeoutMs ?? DEFAULT_TIMEOUT_MS;
  if (signal.aborted) throw new ProviderError('canceled', 'the model step was canceled');
  const ctl = new AbortController();
  let timedOut: 'idle' | 'deadline' | null = null;
  let timer: NodeJS.Timeout | undefined;
  const arm = () => {
    clearTimeout(timer);
    timer = setTimeout(() => {
      timedOut ??= 'idle';
      ctl.abort();
    }, timeoutMs);
  };
  const deadline = opts.deadlineMs === undefined ? undefined : setTimeout(() => {
    timedOut ??= 'deadline';
    ctl.abort();
  }, Math.max(1, opts.deadlineMs));
  const onAbort = () => ctl.abort();
  signal.addEventListener('abort', onAbort, { once: true });
  const classify = (err: unknown): ProviderError => {
    if (ProviderError.is(err)) return err;
    if (signal.aborted) return new ProviderError('canceled', 'the model step was canceled');
    if (timedOut === 'deadline') return new ProviderError('timeout', `${provider} did not finish within the step deadline of ${opts.deadlineMs} ms`);
    if (timedOut) return new ProviderError('timeout', `${provider} did not answer within ${timeoutMs} ms`);
    const code = (err as { cause?: { code?: string } }).cause?.code;
    return new ProviderError('network', `${provider} is unreachable${code ? ` (${code})` : ''}`);
  };
  arm();
  try {
    let res: Response;
    try {
      res = await fetch(url, {
        method: 'POST',
        headers: { 'content-type': 'application/json', accept: 'text/event-stream', ...headers },
        body: JSON.stringify(body),
        signal: ctl.signal,
      });
    } catch (err) {
      throw classify(err);
    }
    if (!res.ok || !res.body) {
      let text: string;
      try {
        text = await boundedText(res);
      } catch (err) {
        if (signal.aborted || timedOut) throw classify(err);
        text = '';
      }
      throw httpError(provider, res.status, res.headers, text);
    }
    arm();
    try {
      for await (const m of sseMessages(res.body)) {
        if (!opts.isContent || opts.isContent(m)) arm();
        yield m;
      }
    } catch (err) {
      throw classify(err);
    }
    // A body cut by the watchdog may end quietly instead of throwing.
    if (timedOut) throw classify(new Error('timed out'));
  } finally {
    clearTimeout(timer);
    clearTimeout(deadline);
    signal.removeEventListener('abort', onAbort);
    ctl.abort();
  }
}

/** The most of a JSON answer (a health probe's model list) read; a larger one is a `bad_request`. */
export const JSON_BODY_MAX_BYTES = 8 * 1024 * 1024;

/** GET a JSON endpoint (health probes). */
export async function getJson(provider: string, url: string, headers: Record<string, string>, signal: AbortSignal, timeoutMs = 10_000): Promise<unknown> {
  const timeout = AbortSignal.timeout(timeoutMs);
  let res: Response;
  try {
    res = await fetch(url, { headers, signal: AbortSignal.any([signal, timeout]) });
  } catch (err) {
    if (signal.aborted) throw new ProviderError('canceled', 'the probe was canceled');
    if (timeout.aborted) throw new ProviderError('timeout', `${provider} did not answer within ${timeoutMs} ms`);
    const code = (err as { cause?: { code?: string } }).cause?.code;
    throw new ProviderError('network', `${provider} is unreachable${code ? ` (${code})` : ''}`);
  }
  if (!res.ok) throw httpError(provider, res.status, res.headers, await boundedText(res).catch(() => ''));
  // Read only so far: a body that is larger (or never ends) is not kept in memory.
  let body: { text: string; full: boolean };
  try {
    body = await boundedBody(res, JSON_BODY_MAX_BYTES + 1);
  } catch {
    if (signal.aborted) throw new ProviderError('canceled', 'the probe was canceled');
    if (timeout.aborted) throw new ProviderError('timeout', `${provider} did not answer within ${timeoutMs} ms`);
    throw new ProviderError('network', `${provider} closed the connection mid-answer`);
  }
  const text = body.text;
  if (body.full) throw new ProviderError('bad_request', `${provider} answered with more than ${JSON_BODY_MAX_BYTES} bytes`);
  try {
    return JSON.parse(text) as unknown;
  } catch {
    throw new ProviderError('bad_request', `${provider} answered with something other than JSON`);
  }
}

export function joinUrl(base: string, path: string): string {
  return `${base.replace(/\/+$/, '')}/${path.replace(/^\/+/, '')}`;
}

/**
 * The most characters of tool calls (ids, names and streamed arguments together) one provider
 * call may assemble: a provider that keeps streaming argument fragments is cut off instead of
 * being buffered in memory until the step's deadline.
 */
export const TOOL_CALLS_MAX_CHARS = 4 * 1024 * 1024;

/** What one more assembled tool call (or content block) counts against `TOOL_CALLS_MAX_CHARS`, besides its text. */
export const TOOL_CALL_OVERHEAD_CHARS = 64;

/**
 * Counts the characters of tool calls a provider call assembles (`true` for a new call or block:
 * its overhead); throws `bad_request` past `max`.
 */
export function toolCallBudget(provider: string, max = TOOL_CALLS_MAX_CHARS): (text: string | undefined | true) => void {
  let used = 0;
  return (text) => {
    used += text === true ? TOOL_CALL_OVERHEAD_CHARS : text?.length ?? 0;
    if (used > max) throw new ProviderError('bad_request', `${provider} streamed tool calls larger than ${max} characters`);
  };
}

/** Parse streamed tool arguments; a model that produced broken JSON gets its raw text back. */
export function parseToolInput(raw: string): unknown {
  if (raw.trim() === '') return {};
  try {
    return JSON.parse(raw) as unknown;
  } catch {
    return { _raw_arguments: raw };
  }
}
