import { request as httpRequest, type IncomingMessage } from 'node:http';
import { request as httpsRequest } from 'node:https';
import type { LookupFunction } from 'node:net';
import { Readable } from 'node:stream';
import type { FetchLike } from '@modelcontextprotocol/client';
import { resolveAllowed, type EgressPolicy } from '../webhooks/ssrf.js';

const urlOf = (input: string | URL | Request): URL => new URL(typeof input === 'string' ? input : input instanceof URL ? input.href : input.url);

function bodyOf(body: RequestInit['body']): string | Uint8Array | undefined {
  if (body === undefined || body === null) return undefined;
  if (typeof body === 'string' || body instanceof Uint8Array) return body;
  if (body instanceof ArrayBuffer) return new Uint8Array(body);
  if (body instanceof URLSearchParams) return body.toString();
  throw new Error('only string and byte request bodies are sent to an MCP server');
}

/**
 * The fetch of the MCP client that reaches a Connection's server (the runtime endpoint's
 * upstream), inside the outbound address guard: for every request the host is resolved, every
 * address it resolves to must be one the policy allows (`egress to … is refused` otherwise,
 * before anything connects), and the request connects to exactly the address that was checked,
 * so a DNS answer that changes between the check and the connection cannot redirect it. A
 * redirect is never followed here: the response goes back to the client as it came (the SDK
 * follows only same-origin redirects, each through this fetch again).
 */
export function guardedFetch(policy: EgressPolicy): FetchLike {
  return async (input, init) => {
    const url = urlOf(input as string | URL | Request);
    if (url.protocol !== 'http:' && url.protocol !== 'https:') throw new Error(`an MCP server is reached over http or https, not ${url.protocol}`);
    const target = await resolveAllowed(url.hostname, policy);
    const lookup: LookupFunction = (_host, opts, cb) => {
      if ((opts as { all?: boolean }).all) (cb as unknown as (e: null, a: { address: string; family: number }[]) => void)(null, [target]);
      else cb(null, target.address, target.family);
    };
    const headers: Record<string, string> = {};
    new Headers(init?.headers).forEach((v, k) => {
      headers[k] = v;
    });
    const body = bodyOf(init?.body);
    if (body !== undefined && headers['content-length'] === undefined) headers['content-length'] = String(Buffer.byteLength(body));
    const method = (init?.method ?? 'GET').toUpperCase();
    const send = url.protocol === 'https:' ? httpsRequest : httpRequest;
    return new Promise<Response>((resolve, reject) => {
      const req = send(url, { method, headers, lookup, ...(init?.signal ? { signal: init.signal } : {}) }, (res: IncomingMessage) => {
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
