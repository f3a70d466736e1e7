import { base64url, flattenedVerify, importJWK, type JWK } from 'jose';
import { jcsCanonicalize, sha256Hex } from '@agentplane/core';

/** An ES256 public verification key of a tool source (a public JWK; `d` is never accepted). */
export interface VerificationKey {
  kty: 'EC';
  crv: 'P-256';
  x: string;
  y: string;
  kid: string;
  alg: 'ES256';
}

/** The one security alternative a synced card requires (never a credential: only its shape). */
export type PeerSecurity =
  | { kind: 'bearer'; scheme_name: string }
  | { kind: 'oauth2_authorization_code'; scheme_name: string; scopes: string[]; authorization_url: string; token_url: string }
  | { kind: 'mtls'; scheme_name: string };

export interface CardSkillTool {
  /** The Tool's name as Sessions see it: `a2a_<source name>_<skill id>`, sanitised. */
  name: string;
  skill_id: string;
  description: string;
  /** Every A2A skill tool is always-ask: each call waits for an ActionApproval. */
  approval: 'always_ask';
}

/** What a verified card fixes for the calls that follow (docs/A2A_TOOLS.md, "Sync"). */
export interface Discovery {
  card_digest: string;
  key_id: string;
  agent_name: string;
  agent_version: string;
  interface: { url: string; protocol_binding: 'JSONRPC'; protocol_version: string };
  streaming: boolean;
  push_notifications: boolean;
  security: PeerSecurity;
  tools: CardSkillTool[];
}

/** A card refused at sync: `reason` is a stable code, `detail` a sentence. */
export class CardRejected extends Error {
  constructor(readonly reason: CardRejection, readonly detail: string) {
    super(`${reason}: ${detail}`);
  }
}

export type CardRejection =
  | 'malformed_card'
  | 'unsigned_card'
  | 'bad_signature'
  | 'unsupported_required_extension'
  | 'non_text_modes'
  | 'no_jsonrpc_interface'
  | 'interface_outside_egress'
  | 'unsupported_security';

type J = Record<string, unknown>;
const isObj = (v: unknown): v is J => v !== null && typeof v === 'object' && !Array.isArray(v);
const strings = (v: unknown): string[] | null => (Array.isArray(v) && v.every((s) => typeof s === 'string') ? (v as string[]) : null);
const TEXT = 'text/plain';

/** The bytes an A2A card signature covers: the RFC 8785 form of the card without `signatures`. */
export function signingInput(card: J): string {
  const { signatures: _omit, ...rest } = card;
  return jcsCanonicalize(rest);
}

/**
 * Verifies the detached ES256 JWS of a card (A2A `AgentCardSignature`: `protected` and
 * `signature`, the payload detached) against the source's keys. The protected header must name
 * `alg: ES256` and the `kid` of one configured key. Returns the kid that verified.
 */
export async function verifyCardSignature(card: J, keys: readonly VerificationKey[]): Promise<string> {
  const sigs = Array.isArray(card.signatures) ? card.signatures : [];
  if (sigs.length === 0) throw new CardRejected('unsigned_card', 'the card carries no signature');
  let payload: string;
  try {
    payload = base64url.encode(signingInput(card));
  } catch (e) {
    throw new CardRejected('malformed_card', `the card has no canonical form (${(e as Error).message})`);
  }
  for (const sig of sigs) {
    if (!isObj(sig) || typeof sig.protected !== 'string' || typeof sig.signature !== 'string') continue;
    let header: J;
    try {
      header = JSON.parse(new TextDecoder().decode(base64url.decode(sig.protected))) as J;
    } catch {
      continue;
    }
    if (!isObj(header) || header.alg !== 'ES256' || typeof header.kid !== 'string') continue;
    const jwk = keys.find((k) => k.kid === header.kid);
    if (!jwk) continue;
    try {
      const key = await importJWK({ kty: jwk.kty, crv: jwk.crv, x: jwk.x, y: jwk.y } as JWK, 'ES256');
      await flattenedVerify({ protected: sig.protected, payload, signature: sig.signature }, key, { algorithms: ['ES256'] });
      return jwk.kid;
    } catch {
      // Another signature may still verify; none that does is a rejection below.
    }
  }
  throw new CardRejected('bad_signature', 'no signature verifies with the source\'s verification keys over the canonical card');
}

/** The one supported security alternative of a card, or the rejection. */
export function chooseSecurity(card: J): PeerSecurity {
  const schemes = isObj(card.securitySchemes) ? card.securitySchemes : {};
  const reqs = Array.isArray(card.securityRequirements) ? card.securityRequirements : [];
  const reject = (d: string) => new CardRejected('unsupported_security', d);
  if (reqs.length !== 1) throw reject(`the card must require exactly one security alternative (it lists ${reqs.length})`);
  const alt = reqs[0];
  const entries = isObj(alt) && isObj(alt.schemes) ? Object.entries(alt.schemes) : [];
  if (entries.length !== 1) throw reject('the security alternative must name exactly one scheme');
  const [name, req] = entries[0]!;
  const scopes = isObj(req) ? (req.list === undefined ? [] : strings(req.list)) : null;
  if (scopes === null) throw reject('the required scopes are not a list of strings');
  const scheme = schemes[name];
  if (!isObj(scheme)) throw reject(`the security scheme ${name} is not declared`);
  const cases = Object.keys(scheme);
  if (cases.length !== 1) throw reject(`the security scheme ${name} is not one scheme`);
  const kind = cases[0]!;
  const body = scheme[kind];
  if (!isObj(body)) throw reject(`the security scheme ${name} is malformed`);
  if (kind === 'httpAuthSecurityScheme') {
    if (typeof body.scheme !== 'string' || body.scheme.toLowerCase() !== 'bearer') throw reject('HTTP authentication other than Bearer is not supported');
    if (scopes.length !== 0) throw reject('a Bearer alternative takes no scopes');
    return { kind: 'bearer', scheme_name: name };
  }
  if (kind === 'mtlsSecurityScheme') {
    if (scopes.length !== 0) throw reject('an mTLS alternative takes no scopes');
    return { kind: 'mtls', scheme_name: name };
  }
  if (kind === 'oauth2SecurityScheme') {
    const flows = isObj(body.flows) ? body.flows : {};
    const flowNames = Object.keys(flows);
    if (flowNames.length !== 1 || flowNames[0] !== 'authorizationCode') throw reject('only the OAuth2 authorization-code flow, alone, is supported');
    const flow = flows.authorizationCode;
    if (!isObj(flow) || typeof flow.authorizationUrl !== 'string' || typeof flow.tokenUrl !== 'string') throw reject('the authorization-code flow is malformed');
    const declared = isObj(flow.scopes) ? flow.scopes : {};
    if (new Set(scopes).size !== scopes.length) throw reject('the required OAuth2 scopes repeat a scope');
    const unknown = scopes.filter((s) => !Object.hasOwn(declared, s));
    if (unknown.length > 0) throw reject(`the required OAuth2 scopes are not declared by the flow: ${unknown.join(', ')}`);
    return { kind: 'oauth2_authorization_code', scheme_name: name, scopes: [...scopes], authorization_url: flow.authorizationUrl, token_url: flow.tokenUrl };
  }
  throw reject(`${kind.replace(/SecurityScheme$/, '')} security is not supported`);
}

/** A Tool name from a source name and a skill id: `[A-Za-z0-9_-]`, at most 64 characters. */
export function toolName(sourceName: string, skillId: string): string {
  const clean = (s: string) => s.replace(/[^A-Za-z0-9_-]+/g, '_').replace(/^_+|_+$/g, '');
  const base = `a2a_${clean(sourceName)}_${clean(skillId)}`;
  return base.length <= 64 ? base : `${base.slice(0, 55)}_${sha256Hex(base).slice(0, 8)}`;
}

/**
 * Verifies a fetched card and fixes its Discovery. `rpcUrl` is the JSON-RPC POST the provider
 * package admits: the chosen interface must be exactly that URL.
 */
export async function verifyCard(raw: unknown, opts: { keys: readonly VerificationKey[]; rpcUrl: string; sourceName: string }): Promise<Discovery> {
  if (!isObj(raw)) throw new CardRejected('malformed_card', 'the card is not a JSON object');
  const card = raw;
  const keyId = await verifyCardSignature(card, opts.keys);

  const caps = isObj(card.capabilities) ? card.capabilities : {};
  const extensions = Array.isArray(caps.extensions) ? caps.extensions : [];
  const required = extensions.filter((e) => isObj(e) && e.required === true).map((e) => String((e as J).uri));
  if (required.length > 0) throw new CardRejected('unsupported_required_extension', `the card requires extensions this platform does not implement: ${required.join(', ')}`);

  const interfaces = Array.isArray(card.supportedInterfaces) ? card.supportedInterfaces.filter(isObj) : [];
  const jsonrpc = interfaces.filter((i) => i.protocolBinding === 'JSONRPC' && typeof i.protocolVersion === 'string' && /^1\.\d+$/.test(i.protocolVersion));
  if (jsonrpc.length !== 1) throw new CardRejected('no_jsonrpc_interface', `the card must offer exactly one A2A v1 JSON-RPC interface (it offers ${jsonrpc.length})`);
  const chosen = jsonrpc[0]!;
  if (typeof chosen.url !== 'string' || chosen.url !== opts.rpcUrl) {
    throw new CardRejected('interface_outside_egress', `the JSON-RPC interface ${String(chosen.url)} is not the POST the provider package admits (${opts.rpcUrl})`);
  }
  if (typeof chosen.tenant === 'string' && chosen.tenant !== '') throw new CardRejected('no_jsonrpc_interface', 'the JSON-RPC interface names a tenant');

  const inModes = strings(card.defaultInputModes);
  const outModes = strings(card.defaultOutputModes);
  const textOnly = (m: string[] | null) => m !== null && m.length > 0 && m.every((x) => x === TEXT);
  if (!textOnly(inModes) || !textOnly(outModes)) throw new CardRejected('non_text_modes', 'the card\'s default input and output modes must be text/plain only');

  const security = chooseSecurity(card);

  const skills = Array.isArray(card.skills) ? card.skills : [];
  if (skills.length === 0) throw new CardRejected('malformed_card', 'the card declares no skills');
  const tools: CardSkillTool[] = [];
  const names = new Set<string>();
  for (const s of skills) {
    if (!isObj(s) || typeof s.id !== 'string' || s.id === '') throw new CardRejected('malformed_card', 'a skill has no id');
    for (const modes of [s.inputModes, s.outputModes]) {
      if (modes !== undefined && !(strings(modes)?.every((x) => x === TEXT) ?? false)) throw new CardRejected('non_text_modes', `skill ${s.id} is not text/plain in and out`);
    }
    if (Array.isArray(s.securityRequirements) && s.securityRequirements.length > 0) {
      throw new CardRejected('unsupported_security', `skill ${s.id} declares its own security requirements`);
    }
    const name = toolName(opts.sourceName, s.id);
    if (names.has(name)) throw new CardRejected('malformed_card', `two skills map to the tool name ${name}`);
    names.add(name);
    const description = typeof s.description === 'string' ? s.description : typeof s.name === 'string' ? s.name : s.id;
    tools.push({ name, skill_id: s.id, description: description.slice(0, 1024), approval: 'always_ask' });
  }

  return {
    card_digest: `sha256:${sha256Hex(signingInput(card))}`,
    key_id: keyId,
    agent_name: typeof card.name === 'string' ? card.name : '',
    agent_version: typeof card.version === 'string' ? card.version : '',
    interface: { url: chosen.url, protocol_binding: 'JSONRPC', protocol_version: String(chosen.protocolVersion) },
    streaming: caps.streaming === true,
    push_notifications: caps.pushNotifications === true,
    security,
    tools,
  };
}
