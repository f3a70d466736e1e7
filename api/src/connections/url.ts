import { checkHost, type EgressPolicy } from '@agentplane/core';

/**
 * A Connection's URL as written, inside the outbound address guard (docs/MCP.md,
 * "Connections"): a loopback host only in development mode, another private or reserved address
 * only where the operator allows private networks (400 `validation.malformed`). A name that
 * resolves to such an address is refused when the platform connects to it. A URL that does not
 * parse is left to the Connection's own checks, which report it.
 */
export function checkConnectionUrl(raw: string, policy: EgressPolicy): void {
  let url: URL;
  try {
    url = new URL(raw);
  } catch {
    return;
  }
  checkHost(url.hostname, policy);
}
