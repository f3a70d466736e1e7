import { ApiError, newId, nowIso, type SecretBox, staleOrAhead } from '@agentplane/core';
import { tags, type DocumentStore, type ListPage } from '@agentplane/store';
import { checkWellFormed } from '../memory/model.js';
import { checkPeerCredential, parseOAuth2Credential } from './peer-credentials.js';
import { lastGeneration, VAULT_LIMITS, type SecretKind, type VaultDoc, type VaultSecret } from './model.js';

const INDEX = 'vaults';
/** The value's last 4 characters (whole code points), for a value longer than 8. */
const hint = (value: string) => (value.length <= 8 ? '…' : `…${Array.from(value.slice(-8)).slice(-4).join('')}`);
/**
 * The hint of a secret of `kind`: its value's, but for a peer credential (a JSON value, whose
 * tail is the end of whichever member comes last: a client secret, a refresh token) the access
 * token's for `a2a_oauth2` and none for `a2a_mtls`. The value is checked before.
 */
const hintOf = (kind: SecretKind, value: string): string =>
  kind === 'a2a_oauth2' ? hint(parseOAuth2Credential(value).access_token) : kind === 'a2a_mtls' ? '…' : hint(value);
const aad = (vaultId: string, name: string, generation: number) => `vault:${vaultId}:${name}:${generation}`;
/**
 * The deleted names whose last generation a vault keeps (the most recently deleted): a name
 * deleted longer ago than this many others starts again at generation 1 when written again.
 */
const MAX_RETIRED_NAMES = 256;
/** A copy of `record` without `name`. */
const withoutName = (record: Readonly<Record<string, number>>, name: string): Record<string, number> =>
  Object.fromEntries(Object.entries(record).filter(([k]) => k !== name));

/** A secret resolved for one use: the plaintext never leaves the process that asked. */
export interface ResolvedSecret {
  vault_id: string;
  name: string;
  kind: SecretKind;
  header_name: string | null;
  username: string | null;
  /** The secret's `match` and generation: what a compare-and-swap write-back names. */
  match: string;
  generation: number;
  value: string;
}

/**
 * Header names an `mcp_header` secret may not set (compared in lower case): hop-by-hop and
 * framing headers, which would break the proxy's request to the server or its connection, and
 * the headers the MCP transport sets itself.
 */
export const FORBIDDEN_HEADER_NAMES: ReadonlySet<string> = new Set([
  'connection', 'keep-alive', 'proxy-connection', 'proxy-authenticate', 'proxy-authorization', 'te', 'trailer', 'transfer-encoding', 'upgrade',
  'host', 'content-length', 'content-encoding', 'content-type', 'expect', 'accept',
  'mcp-session-id', 'mcp-protocol-version', 'mcp-method', 'mcp-name', 'last-event-id',
]);

/**
 * A value sent as an HTTP header value (`mcp_header`, and `mcp_bearer` after `Bearer `): visible
 * ASCII, with spaces and tabs inside only. Node would also pass bytes 0x80-0xFF (U+0085, `é`), as
 * Latin-1, which is not what the writer meant; a character beyond that fails the request.
 */
const HEADER_VALUE = /^[\x21-\x7e](?:[\t\x20-\x7e]*[\x21-\x7e])?$/;

/** Whether `value` can go out as an HTTP header value as written (see `HEADER_VALUE`): vault header secrets and Connection tokens. */
export function isHeaderValue(value: string): boolean {
  return HEADER_VALUE.test(value);
}

/** The value's checks of every kind, and of the kinds sent in a header; 400 `validation.malformed`. */
export function checkSecretValue(kind: SecretKind, value: string, headerName: string | undefined): void {
  checkWellFormed(value, 'body.value');
  const bytes = Buffer.byteLength(value, 'utf8');
  if (bytes > VAULT_LIMITS.maxValueBytes) throw new ApiError('validation.malformed', `body.value: ${bytes} bytes; a secret value is at most ${VAULT_LIMITS.maxValueBytes} bytes (16 KiB) of UTF-8`);
  if (/[\r\n\0]/.test(value)) throw new ApiError('validation.malformed', 'body.value: no line breaks or NUL characters');
  if (headerName !== undefined && FORBIDDEN_HEADER_NAMES.has(headerName.toLowerCase())) {
    throw new ApiError('validation.malformed', `body.header_name: ${headerName} is a header the MCP proxy sets or that frames the request; an mcp_header secret cannot set it`);
  }
  if ((kind === 'mcp_header' || kind === 'mcp_bearer') && !isHeaderValue(value)) {
    throw new ApiError('validation.malformed', `body.value: an ${kind} value is sent in an HTTP header: visible ASCII characters only, with spaces or tabs only between them`);
  }
}

/** `match` checked and normalised: an absolute http(s) URL without credentials, query or fragment; no trailing `/`. */
export function normaliseMatch(match: string, kind: SecretKind): string {
  let u: URL;
  try {
    u = new URL(match);
  } catch {
    throw new ApiError('validation.malformed', 'body.match: not an absolute URL');
  }
  const httpOk = kind !== 'git_https';
  if (u.protocol !== 'https:' && !(httpOk && u.protocol === 'http:')) {
    throw new ApiError('validation.malformed', `body.match: ${kind === 'git_https' ? 'git secrets are for https:// repository URLs' : 'must be http or https'}`);
  }
  if (u.username || u.password || u.search || u.hash) throw new ApiError('validation.malformed', 'body.match: no credentials, query or fragment');
  return `${u.origin}${u.pathname.replace(/\/+$/, '')}`;
}

/** Whether `match` (normalised) covers `url`: same origin, and the path equal to or below the match's path. */
export function matchCovers(match: string, url: string): boolean {
  let u: URL;
  let m: URL;
  try {
    u = new URL(url);
    m = new URL(match);
  } catch {
    return false;
  }
  if (u.origin !== m.origin) return false;
  const base = m.pathname.replace(/\/+$/, '');
  return base === '' || u.pathname === base || u.pathname.startsWith(`${base}/`);
}

/**
 * Vaults: named secrets of a Workspace, sealed with the master key like ModelCredential secrets,
 * never returned, rotatable by writing the same name again. Sessions name vaults in `vault_ids`;
 * `resolve` walks them in that order and the first vault holding a secret for the URL wins
 * (docs/MEMORY.md, "Vaults").
 */
export class VaultService {
  constructor(
    private readonly docs: DocumentStore,
    private readonly box: SecretBox,
  ) {}

  async create(workspaceId: string, input: { name: string; description?: string | null | undefined }, id = newId('vault')): Promise<VaultDoc> {
    checkWellFormed(input.name, 'body.name');
    if (typeof input.description === 'string') checkWellFormed(input.description, 'body.description');
    const now = nowIso();
    const doc: VaultDoc = {
      id, type: 'vault', workspace_id: workspaceId, name: input.name, description: input.description ?? null, secrets: [],
      version: 1, created_at: now, updated_at: now,
    };
    await this.docs.create(tags.workspace(workspaceId), doc, [INDEX]);
    return doc;
  }

  find(workspaceId: string, vaultId: string): Promise<VaultDoc | null> {
    return this.docs.get<VaultDoc>(tags.workspace(workspaceId), vaultId);
  }

  async get(workspaceId: string, vaultId: string): Promise<VaultDoc> {
    const doc = await this.find(workspaceId, vaultId);
    if (!doc || doc.type !== 'vault' || doc.workspace_id !== workspaceId) throw new ApiError('validation.not_found', `vault ${vaultId} not found`);
    return doc;
  }

  /** 404 naming the first id that is not a vault of the Workspace. */
  async requireAll(workspaceId: string, vaultIds: readonly string[]): Promise<void> {
    for (const id of vaultIds) await this.get(workspaceId, id);
  }

  list(workspaceId: string, options: { limit: number; page?: string | undefined }): Promise<ListPage<VaultDoc>> {
    return this.docs.list<VaultDoc>(tags.workspace(workspaceId), INDEX, { ...options, order: 'asc' });
  }

  /** Of concurrent deletions one removes the vault; the others are 404, as a later one is. */
  async remove(workspaceId: string, vaultId: string): Promise<void> {
    await this.get(workspaceId, vaultId);
    const removed = await this.docs.removeIfVersion(tags.workspace(workspaceId), vaultId, undefined, [INDEX]);
    if (removed.kind !== 'removed') throw new ApiError('validation.not_found', `vault ${vaultId} not found`);
  }

  /** Creates or rotates a secret. `expected_generation` 0 creates only; n rotates only generation n. */
  async putSecret(workspaceId: string, vaultId: string, name: string, input: {
    kind: SecretKind; match: string; value: string; header_name?: string | undefined; username?: string | undefined; expected_generation?: number | undefined;
  }): Promise<VaultDoc> {
    const match = normaliseMatch(input.match, input.kind);
    if (input.kind === 'mcp_header' && !input.header_name) throw new ApiError('validation.malformed', 'body.header_name: required for an mcp_header secret');
    if (input.kind !== 'mcp_header' && input.header_name !== undefined) throw new ApiError('validation.malformed', 'body.header_name: only mcp_header secrets name a header');
    if (input.kind !== 'git_https' && input.username !== undefined) throw new ApiError('validation.malformed', 'body.username: only git_https secrets have a username');
    checkSecretValue(input.kind, input.value, input.header_name);
    if (input.kind === 'a2a_oauth2' || input.kind === 'a2a_mtls') checkPeerCredential(input.kind, input.value);
    await this.get(workspaceId, vaultId);
    return this.docs.update<VaultDoc>(tags.workspace(workspaceId), vaultId, (v) => {
      const cur = v.secrets.find((s) => s.name === name);
      const expected = input.expected_generation;
      // Absent, the secret is at generation 0 (create only); written again after a delete, it
      // continues from the deleted one's generation, which a stale expectation still names.
      if (expected !== undefined && (cur?.generation ?? 0) !== expected) {
        throw new ApiError('validation.conflict', `expected_generation ${expected} ${staleOrAhead(expected, cur?.generation ?? 0)}; secret ${name} is at generation ${cur?.generation ?? 0}`);
      }
      if (!cur && v.secrets.length >= VAULT_LIMITS.maxSecrets) throw new ApiError('validation.malformed', `a vault holds at most ${VAULT_LIMITS.maxSecrets} secrets`);
      const generation = lastGeneration(v, name) + 1;
      const secret: VaultSecret = {
        name, kind: input.kind, match, header_name: input.header_name ?? null,
        username: input.kind === 'git_https' ? (input.username ?? 'x-access-token') : null,
        generation, secret_hint: hintOf(input.kind, input.value), updated_at: nowIso(), sealed: this.box.seal(input.value, aad(vaultId, name, generation)),
      };
      const secrets = cur ? v.secrets.map((s) => (s.name === name ? secret : s)) : [...v.secrets, secret];
      return { ...v, secrets, ...(v.retired_generations ? { retired_generations: withoutName(v.retired_generations, name) } : {}) };
    }, { notFound: 'vault' });
  }

  /**
   * 404 when the vault holds no secret `name`, including when a concurrent deletion removed it
   * first: of concurrent deletions of one secret exactly one answers the vault without it.
   */
  async deleteSecret(workspaceId: string, vaultId: string, name: string): Promise<VaultDoc> {
    const missing = () => new ApiError('validation.not_found', `vault ${vaultId} holds no secret ${name}`);
    const v = await this.get(workspaceId, vaultId);
    if (!v.secrets.some((s) => s.name === name)) throw missing();
    // Whether the last run of the change (it runs again after a lost race) found the secret: a
    // run that did not writes nothing, and `update` answers the vault as it is.
    let found = false;
    const updated = await this.docs.update<VaultDoc>(tags.workspace(workspaceId), vaultId, (cur) => {
      const gone = cur.secrets.find((s) => s.name === name);
      found = gone !== undefined;
      if (!gone) return null;
      // Its generation is kept, so the name written again continues from it (see `putSecret`).
      const retired = Object.entries({ ...withoutName(cur.retired_generations ?? {}, name), [name]: gone.generation }).slice(-MAX_RETIRED_NAMES);
      return { ...cur, secrets: cur.secrets.filter((s) => s.name !== name), retired_generations: Object.fromEntries(retired) };
    }, { notFound: 'vault' });
    if (!found) throw missing();
    return updated;
  }

  /**
   * The secret for `url` among `kinds`, from the first vault in `vaultIds` order that holds one
   * (inside a vault, the longest matching `match` wins). Vaults that no longer exist are skipped.
   * Null when none does. The plaintext is for the caller's own request only.
   */
  async resolve(workspaceId: string, vaultIds: readonly string[], kinds: readonly SecretKind[], url: string): Promise<ResolvedSecret | null> {
    if (vaultIds.length === 0) return null;
    const vaults = await this.docs.getMany<VaultDoc>(tags.workspace(workspaceId), vaultIds);
    const byId = new Map(vaults.filter((v) => v.type === 'vault' && v.workspace_id === workspaceId).map((v) => [v.id, v]));
    for (const id of vaultIds) {
      const v = byId.get(id);
      if (!v) continue;
      const best = v.secrets
        .filter((s) => kinds.includes(s.kind) && matchCovers(s.match, url))
        .sort((a, b) => b.match.length - a.match.length)[0];
      if (best) {
        return {
          vault_id: v.id, name: best.name, kind: best.kind, header_name: best.header_name, username: best.username, match: best.match, generation: best.generation,
          value: this.box.open(best.sealed, aad(v.id, best.name, best.generation)),
        };
      }
    }
    return null;
  }
}
