import type { FetchLike } from '@modelcontextprotocol/client';
import { egressFetch } from '../webhooks/egress-fetch.js';
import type { EgressPolicy } from '../webhooks/ssrf.js';

/**
 * The fetch of the MCP client that reaches a Connection's server (the runtime endpoint's
 * upstream): the outbound address guard's pinned fetch (`webhooks/egress-fetch.ts`), shared with
 * A2A tool source calls. Every request's host is resolved and checked, and the request connects
 * to exactly the address that was checked. A redirect is never followed here: the response goes
 * back to the client as it came (the SDK follows only same-origin redirects, each through this
 * fetch again).
 */
export function guardedFetch(policy: EgressPolicy): FetchLike {
  return egressFetch({ policy });
}
