import { request as httpRequest, type IncomingMessage } from 'node:http';
import { Agent as HttpsAgent, request as httpsRequest } from 'node:https';
import type { LookupFunction } from 'node:net';
import { Readable } from 'node:stream';
import { resolveAllowed, type EgressPolicy } from '@agentplane/core';

/** The fetch of an outbound request: what `egressFetch` returns. */
export type EgressFetch = (input: string | URL | Request, init?: RequestInit) => Promise<Response>;

export interface EgressFetchOptions {
  /**
   * The outbound address guard. Without it the host is resolved as any connection resolves it
   * (for callers that reach an address the platform chose, and for tests).
   */
  policy?: EgressPolicy | undefined;
  /**
   * A client certificate and its key (PEM) presented on the TLS connection (mTLS): https only,
   * over one TLS agent per `egressFetch`, never pooled with other credentials.
   */
  tls?: { cert: string; key: string } | undefined;
}

/**
 * `p`, or the signal's reason as soon as it aborts: the caller's deadline holds while the host is
 * looked up too (a lookup cannot be called off; a name server that never answers would otherwise
 * hold the request past it, and its late answer is dropped).
 */
function untilAborted<T>(p: Promise<T>, signal: AbortSignal | null | undefined): Promise<T> {
  if (!signal) return p;
  if (signal.aborted) return Promise.reject(signal.reason as Error);
  return new Promise<T>((resolve, reject) => {
    const onAbort = (): void => reject(signal.reason as Error);
    signal.addEventListener('abort', onAbort, { once: true });
    p.then(
      (v) => { signal.removeEventListener('abort', onAbort); resolve(v); },
      (err: unknown) => { signal.removeEventListener('abort', onAbort); reject(err as Error); },
    );
  });
}

const urlOf = (input: string | URL | Request): URL => new URL(typeof input === 'string' ? input : input instanceof URL ? input.href : input.url);

function bodyOf(body: RequestInit['body']): string | Uint8Array | undefined {
  if (body === undefined || body === null) return undefined;
  if (typeof body === 'string' || body instanceof Uint8Array) return body;
  if (body instanceof ArrayBuffer) return new Uint8Array(body);
  if (body instanceof URLSearchParams) return body.toString();
  throw new Error('only string and byte request bodies are sent on an outbound request');
}

/**
 * The fetch of the control plane's outbound requests to servers a Workspace chooses (an MCP
 * Connection's server, an A2A tool source's peer), over node's http and https, inside the
 * outbound address guard (`@agentplane/core` `egress.ts`): for every request the host is resolved, every address it
 * resolves to must be one the policy allows (`egress to … is refused` otherwise, before anything
 * connects), and the request connects to exactly the address that was checked, so a DNS answer
 * that changes between the check and the connection (rebinding) cannot redirect it. TLS still
 * verifies the certificate against the host name of the URL. A redirect is never followed: the
 * response goes back to the caller as it came. The request's signal ends the wait for the
 * lookup as well as for the answer.
 */
export function egressFetch(options: EgressFetchOptions = {}): EgressFetch {
  const { policy, tls } = options;
  const agent = tls ? new HttpsAgent({ cert: tls.cert, key: tls.key, keepAlive: false }) : undefined;
  return async (input, init) => {
    const url = urlOf(input);
    if (url.protocol !== 'http:' && url.protocol !== 'https:') throw new Error(`an outbound request goes over http or https, not ${url.protocol}`);
    if (tls && url.protocol !== 'https:') throw new Error('a client certificate is presented over https only');
    let lookup: LookupFunction | undefined;
    if (policy) {
      const target = await untilAborted(resolveAllowed(url.hostname, policy), init?.signal);
      lookup = (_host, opts, cb) => {
        if ((opts as { all?: boolean }).all) (cb as unknown as (e: null, a: { address: string; family: number }[]) => void)(null, [target]);
        else cb(null, target.address, target.family);
      };
    }
    const headers: Record<string, string> = {};
    new Headers(init?.headers).forEach((v, k) => {
      headers[k] = v;
    });
    const body = bodyOf(init?.body);
    if (body !== undefined && headers['content-length'] === undefined) headers['content-length'] = String(Buffer.byteLength(body));
    const method = (init?.method ?? (input instanceof Request ? input.method : 'GET')).toUpperCase();
    const send = url.protocol === 'https:' ? httpsRequest : httpRequest;
    return new Promise<Response>((resolve, reject) => {
      const req = send(url, {
        method, headers, ...(lookup ? { lookup } : {}), ...(agent ? { agent } : {}), ...(init?.signal ? { signal: init.signal } : {}),
      }, (res: IncomingMessage) => {
        const out = new Headers();
        for (const [k, v] of Object.entries(res.headers)) if (v !== undefined) for (const one of Array.isArray(v) ? v : [v]) out.append(k, one);
        const status = res.statusCode ?? 502;
        const noBody = status === 204 || status === 304 || method === 'HEAD';
        if (noBody) res.resume();
        resolve(new Response(noBody ? null : (Readable.toWeb(res) as ReadableStream<Uint8Array>), { status, statusText: res.statusMessage ?? '', headers: out }));
      });
      req.on('error', reject);
      req.end(body);
    });
  };
}
