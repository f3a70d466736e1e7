import { Id, Nullable, Obj, Timestamp, Type } from '@agentplane/core';
import type { StoredDoc } from '@agentplane/store';

/**
 * What a vault secret is for, which decides where it is used and how it is sent:
 * - `mcp_bearer`: `Authorization: Bearer <value>` on requests of the runtime MCP proxy to a
 *   Connection whose URL `match` covers;
 * - `mcp_header`: `<header_name>: <value>` on the same requests;
 * - `git_https`: HTTP basic credentials (`username`, the value as password) for the runner's
 *   fetch of a `repository` resource whose URL `match` covers;
 * - `a2a_oauth2`: OAuth2 tokens (JSON) for an external A2A tool source whose JSON-RPC URL
 *   `match` covers; refreshed and written back by the API only (docs/A2A_TOOLS.md);
 * - `a2a_mtls`: a client certificate and key (JSON of PEMs) presented on the TLS connection to
 *   such a peer.
 */
export const SECRET_KINDS = ['mcp_bearer', 'mcp_header', 'git_https', 'a2a_oauth2', 'a2a_mtls'] as const;
export type SecretKind = (typeof SECRET_KINDS)[number];

export interface VaultSecret {
  name: string;
  kind: SecretKind;
  /** `https://host[:port][/path]` (http only for MCP): the URLs the secret is for, by origin and path prefix. */
  match: string;
  header_name: string | null;
  username: string | null;
  /**
   * Rotation counter: 1 on first write, +1 on each rotation. A name written again after its
   * secret was deleted continues from the deleted one's generation (`retired_generations`), so a
   * generation is never reused under a name and a stale `expected_generation` never matches.
   */
  generation: number;
  secret_hint: string;
  updated_at: string;
  /** AES-256-GCM under the master key, bound to the vault, the name and the generation. Never leaves the API. */
  sealed: string;
}

export interface VaultDoc extends StoredDoc {
  type: 'vault';
  workspace_id: string;
  name: string;
  description: string | null;
  secrets: VaultSecret[];
  /** The last generation of each deleted secret's name (absent until one is deleted). Never shown. */
  retired_generations?: Record<string, number>;
}

export const VAULT_LIMITS = Object.freeze({ maxSecrets: 64, maxValueBytes: 16 * 1024 });

export const SecretName = () => Type.String({ pattern: '^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$' });
const Kind = Type.Union(SECRET_KINDS.map((k) => Type.Literal(k)));

export const VaultSchema = Obj({
  id: Id('vault'),
  type: Type.Literal('vault'),
  workspace_id: Id('workspace'),
  name: Type.String({ minLength: 1, maxLength: 200 }),
  description: Nullable(Type.String({ maxLength: 2000 })),
  secrets: Type.Array(Obj({
    name: SecretName(), kind: Kind, match: Type.String(), header_name: Nullable(Type.String()), username: Nullable(Type.String()),
    generation: Type.Integer({ minimum: 1 }), secret_hint: Type.String(), updated_at: Timestamp(),
  })),
  version: Type.Integer({ minimum: 1 }),
  created_at: Timestamp(),
  updated_at: Timestamp(),
});

export const SecretInput = Obj({
  kind: Kind,
  match: Type.String({ minLength: 8, maxLength: 2048 }),
  /** At most `maxValueBytes` of UTF-8: the schema caps characters, the service bytes. */
  value: Type.String({ minLength: 1, maxLength: VAULT_LIMITS.maxValueBytes }),
  header_name: Type.Optional(Type.String({ pattern: "^[A-Za-z0-9!#$%&'*+.^_`|~-]{1,128}$" })),
  username: Type.Optional(Type.String({ minLength: 1, maxLength: 256, pattern: '^[^:\\u0000-\\u001f\\u007f]+$' })),
  expected_generation: Type.Optional(Type.Integer({ minimum: 0 })),
});

/** The head without any sealed material or bookkeeping: what every response shows. */
export function publicVault(v: VaultDoc): Omit<VaultDoc, 'secrets' | 'retired_generations'> & { secrets: Omit<VaultSecret, 'sealed'>[] } {
  const { retired_generations: _r, ...head } = v;
  return { ...head, secrets: v.secrets.map(({ sealed: _s, ...rest }) => rest) };
}

/** The generation a secret named `name` last had in this vault: its current one, else the one it had when deleted, else 0. */
export function lastGeneration(v: VaultDoc, name: string): number {
  const cur = v.secrets.find((s) => s.name === name);
  if (cur) return cur.generation;
  const retired = v.retired_generations;
  return retired && Object.hasOwn(retired, name) ? (retired[name] ?? 0) : 0;
}
