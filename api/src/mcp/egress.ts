import type { FetchLike } from '@modelcontextprotocol/client';
import { egressFetch } from '../webhooks/egress-fetch.js';
import type { EgressPolicy } from '@agentplane/core';
import { MAX_MESSAGE_BYTES } from './protocol.js';

/**
 * The most of one upstream answer read: a 4 MiB JSON-RPC message and its framing (the envelope,
 * SSE lines). A server that answers more is cut off there, as one that does not answer is by the
 * request timeout.
 */
export const MAX_UPSTREAM_RESPONSE_BYTES = MAX_MESSAGE_BYTES + 64 * 1024;

/**
 * `res` with a body that fails once more than `maxBytes` have come in: the bytes past the limit
 * are never read, and the connection is closed (the source cancelled). A reader of the body (a
 * client's JSON or SSE parsing) then fails with the error, instead of buffering what a server
 * sends without end.
 */
export function capResponseBody(res: Response, maxBytes: number): Response {
  if (res.body === null) return res;
  const reader = res.body.getReader();
  let seen = 0;
  const body = new ReadableStream<Uint8Array>({
    async pull(controller) {
      const { done, value } = await reader.read();
      if (done) {
        controller.close();
        return;
      }
      seen += value.byteLength;
      if (seen > maxBytes) {
        const err = new Error(`the response exceeds the ${maxBytes}-byte limit of an upstream answer`);
        controller.error(err);
        await reader.cancel(err).catch(() => undefined);
        return;
      }
      controller.enqueue(value);
    },
    cancel(reason) {
      return reader.cancel(reason);
    },
  });
  return new Response(body, { status: res.status, statusText: res.statusText, headers: res.headers });
}

/**
 * The fetch of the MCP client that reaches a Connection's server (the runtime endpoint's
 * upstream): the outbound address guard's pinned fetch (`webhooks/egress-fetch.ts`), shared with
 * A2A tool source calls. Every request's host is resolved and checked, and the request connects
 * to exactly the address that was checked. A redirect is never followed here: the response goes
 * back to the client as it came (the SDK follows only same-origin redirects, each through this
 * fetch again). Every answer is read up to MAX_UPSTREAM_RESPONSE_BYTES at most.
 */
export function guardedFetch(policy: EgressPolicy): FetchLike {
  const send = egressFetch({ policy });
  return async (input, init) => capResponseBody(await send(input, init), MAX_UPSTREAM_RESPONSE_BYTES);
}
