import { isIP, BlockList } from 'node:net';
import { lookup } from 'node:dns/promises';
import { ApiError } from './errors.js';

/**
 * The SSRF guard of the control plane's outbound requests to addresses a Workspace chooses
 * (docs/AUTOMATIONS.md, "Outbound requests"): webhook deliveries, A2A tool sources, MCP
 * Connections and skill sources. A request may only reach a public address: loopback, private,
 * link-local, carrier-grade NAT, unique-local, multicast and unspecified ranges are refused,
 * checked on the URL when it is written and again on every address its host resolves to when
 * the request is made (which then connects to the very address that was checked, so DNS
 * rebinding cannot swap it).
 *
 * `development`: loopback addresses (and plain `http://`) are allowed, so a local receiver works.
 * `allowPrivate`: the operator allows every range (a platform inside a private network).
 */
export interface EgressPolicy {
  development: boolean;
  allowPrivate: boolean;
}

const PRIVATE = new BlockList();
for (const [net, bits] of [
  ['0.0.0.0', 8], ['10.0.0.0', 8], ['100.64.0.0', 10], ['169.254.0.0', 16], ['172.16.0.0', 12], ['192.0.0.0', 24],
  ['192.168.0.0', 16], ['198.18.0.0', 15], ['224.0.0.0', 4], ['240.0.0.0', 4],
] as const) PRIVATE.addSubnet(net, bits, 'ipv4');
for (const [net, bits] of [['::', 128], ['fc00::', 7], ['fe80::', 10], ['ff00::', 8], ['64:ff9b::', 96]] as const) PRIVATE.addSubnet(net, bits, 'ipv6');
const LOOPBACK = new BlockList();
LOOPBACK.addSubnet('127.0.0.0', 8, 'ipv4');
LOOPBACK.addAddress('::1', 'ipv6');

/** The IPv4 address inside an IPv4-mapped IPv6 address (`::ffff:10.0.0.1`), else the address itself. */
function unmap(address: string): string {
  const m = /^::ffff:(\d+\.\d+\.\d+\.\d+)$/i.exec(address);
  return m?.[1] ?? address;
}

export type AddressClass = 'public' | 'loopback' | 'private';

export function classify(address: string): AddressClass {
  const a = unmap(address);
  const family = isIP(a) === 6 ? 'ipv6' : 'ipv4';
  if (LOOPBACK.check(a, family)) return 'loopback';
  if (PRIVATE.check(a, family)) return 'private';
  return 'public';
}

export function addressAllowed(address: string, policy: EgressPolicy): boolean {
  const c = classify(address);
  return c === 'public' || policy.allowPrivate || (c === 'loopback' && policy.development);
}

const LOOPBACK_NAMES = new Set(['localhost', 'localhost.localdomain', 'ip6-localhost']);

/**
 * A host as written in a URL, read the way the guard reads it: without IPv6 brackets, in lower
 * case, without a fully qualified name's root dot (`localhost.` names the same host); whether it
 * is a literal address, and whether it names loopback (a `localhost` name or a loopback literal).
 */
export function readHost(hostname: string): { host: string; literal: boolean; loopback: boolean } {
  const host = hostname.replace(/^\[|\]$/g, '').toLowerCase().replace(/\.$/, '');
  const literal = isIP(host) !== 0;
  const loopback = LOOPBACK_NAMES.has(host) || host.endsWith('.localhost') || (literal && classify(host) === 'loopback');
  return { host, literal, loopback };
}

/**
 * The checks of a host as written, before any lookup: a loopback name or address only in
 * development mode, any other private or reserved literal only where the operator allows private
 * networks. 400 `validation.malformed` naming `field` otherwise. A name that resolves to such an
 * address passes here; the check at connect time (`resolveAllowed`) refuses it.
 */
export function checkHost(hostname: string, policy: EgressPolicy, field = 'body.url'): { host: string; literal: boolean; loopback: boolean } {
  const h = readHost(hostname);
  if (h.loopback && !policy.development && !policy.allowPrivate) throw new ApiError('validation.malformed', `${field}: loopback addresses are only allowed in development mode`);
  if (h.literal && !addressAllowed(h.host, policy)) throw new ApiError('validation.malformed', `${field}: private and reserved addresses are not reachable from this platform`);
  return h;
}

/** Checks an endpoint URL as written: 400 `validation.malformed` when it can never be delivered to. */
export function checkEndpointUrl(raw: string, policy: EgressPolicy, field = 'body.url'): URL {
  let url: URL;
  try {
    url = new URL(raw);
  } catch {
    throw new ApiError('validation.malformed', `${field}: not a URL`);
  }
  if (url.username || url.password) throw new ApiError('validation.malformed', `${field}: credentials in the URL are not accepted`);
  if (url.hash) throw new ApiError('validation.malformed', `${field}: a fragment is not accepted`);
  const { loopback } = readHost(url.hostname);
  if (url.protocol !== 'https:' && !(url.protocol === 'http:' && (policy.allowPrivate || (policy.development && loopback)))) {
    throw new ApiError('validation.malformed', `${field}: https is required (plain http only for loopback receivers in development mode)`);
  }
  checkHost(url.hostname, policy, field);
  return url;
}

/** Resolves a host for one delivery and returns the first address the policy allows; throws `egress_refused` otherwise. */
export async function resolveAllowed(host: string, policy: EgressPolicy): Promise<{ address: string; family: 4 | 6 }> {
  const bare = host.replace(/^\[|\]$/g, '');
  const addrs = isIP(bare) ? [{ address: bare, family: isIP(bare) as 4 | 6 }] : (await lookup(bare, { all: true, verbatim: true })) as { address: string; family: 4 | 6 }[];
  // Every address must pass: a name that also resolves to a private address is refused outright.
  if (addrs.length === 0 || addrs.some((a) => !addressAllowed(a.address, policy))) throw new EgressRefused(host);
  return addrs[0]!;
}

export class EgressRefused extends Error {
  constructor(host: string) {
    super(`egress to ${host} is refused: it resolves to a private or reserved address`);
  }
}
