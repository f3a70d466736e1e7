import type { EventSourceMessage } from 'eventsource-parser';
import { httpError, ProviderError } from './errors.js';
import { sseMessages } from './sse.js';

export const DEFAULT_TIMEOUT_MS = 60_000;

/**
 * One streaming HTTP exchange with a provider: POST JSON, then yield its SSE messages.
 * A watchdog aborts the request when the headers, or the next chunk, take longer than
 * `timeoutMs` (→ `timeout`, retryable). The caller's signal aborts the request (→ `canceled`).
 */
export async function* postSse(
  provider: string,
  url: string,
  headers: Record<string, string>,
  body: unknown,
  signal: AbortSignal,
  timeoutMs = DEFAULT_TIMEOUT_MS,
): AsyncGenerator<EventSourceMessage> {
  if (signal.aborted) throw new ProviderError('canceled', 'the model step was canceled');
  const ctl = new AbortController();
  let timedOut = false;
  let timer: NodeJS.Timeout | undefined;
  const arm = () => {
    clearTimeout(timer);
    timer = setTimeout(() => {
      timedOut = true;
      ctl.abort();
    }, timeoutMs);
  };
  const onAbort = () => ctl.abort();
  signal.addEventListener('abort', onAbort, { once: true });
  const classify = (err: unknown): ProviderError => {
    if (ProviderError.is(err)) return err;
    if (signal.aborted) return new ProviderError('canceled', 'the model step was canceled');
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
      const text = await res.text().catch(() => '');
      throw httpError(provider, res.status, res.headers, text);
    }
    arm();
    try {
      for await (const m of sseMessages(res.body)) {
        arm();
        yield m;
      }
    } catch (err) {
      throw classify(err);
    }
  } finally {
    clearTimeout(timer);
    signal.removeEventListener('abort', onAbort);
    ctl.abort();
  }
}

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
  const text = await res.text();
  if (!res.ok) throw httpError(provider, res.status, res.headers, text);
  try {
    return JSON.parse(text) as unknown;
  } catch {
    throw new ProviderError('bad_request', `${provider} answered with something other than JSON`);
  }
}

export function joinUrl(base: string, path: string): string {
  return `${base.replace(/\/+$/, '')}/${path.replace(/^\/+/, '')}`;
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
