import { newSecret, secretDigest } from '@agentplane/core';
import { keys, tags, type Redis } from '@agentplane/store';
import type { ToolShaping } from '../deployments/bindings.js';

/** What a Run's agent version allows on one attached Connection. */
export type ToolPermission = 'allow' | 'ask' | 'deny';

export interface ConnectionGrant {
  /** Permission of tools not named in `tools`. */
  default: ToolPermission;
  /** Per-tool overrides, by the upstream tool name. */
  tools?: Record<string, ToolPermission>;
  /**
   * A deployment's connection binding revision for this Connection (Sessions created against a
   * deployment): the tools offered, their names, and the argument policy (docs/DEPLOYMENTS.md).
   */
  shaping?: ToolShaping;
}

/**
 * What a runtime bearer proves: one Run of one Session, holding the current lease, until the
 * lease expires. Minted by the lease work when a lease is granted; the Connections come from
 * the Run's resolved agent version (its `mcp_servers` with their permission policies).
 */
export interface RuntimeGrant {
  run_id: string;
  session_id: string;
  /** The thread of the Run: events the runtime routes append for the Run carry it. */
  session_thread_id?: string | null;
  workspace_id: string;
  organization_id: string;
  /** The lease the bearer was minted for: its id, which is the Session's lease-fence token. */
  lease_id: string;
  /**
   * ISO timestamp; the bearer is dead from this instant (the Redis record also expires then).
   * With a lease fence, liveness is the fence's: use the attempt's hard deadline here.
   */
  expires_at: string;
  connections: Record<string, ConnectionGrant>;
  /** Synced A2A tool sources the harness reaches at `/v1/runtime/toolsource/{id}` (the agent's `a2a_tool_source` entries). */
  tool_sources?: string[];
  /** Files the runner may fetch from `/v1/runtime/files/{id}` (the Session's `file` resources). */
  files?: string[];
  /** MemoryStores the harness's memory tools reach at `/v1/runtime/memory/{id}` (the Session's `memory` resources), with their access. */
  memory?: Record<string, 'read_only' | 'read_write'>;
  /** HTTPS repository URLs of the Session's `repository` resources: `/v1/runtime/git-credentials` answers only for these. */
  repositories?: string[];
  /** `<project_id>@<revision_number>` of the Session's `uploaded_project` resources, for `/v1/runtime/projects/…`. */
  projects?: string[];
  /** Skill refs (`skill_…@n` or a `skp_` id) of the turn spec's `skills`, for `/v1/runtime/skills/…`. */
  skills?: string[];
  /** The runner may store Files the Session's tools produce (browser screenshots) at `POST /v1/runtime/files`. */
  outputs?: boolean;
}

/**
 * The one question the runtime MCP endpoint asks about a bearer. The scheduler (lease) work
 * backs it; `RedisRuntimeBearers` is the default, sharing Redis with the lease engine.
 * Returns null for an unknown, revoked or expired bearer.
 */
export interface RuntimeBearerVerifier {
  verify(bearer: string): Promise<RuntimeGrant | null>;
}

/** The Session lease fence, as far as runtime bearers need it (`LeaseFence` satisfies it). */
export interface LeaseHolder {
  holds(sessionId: string, leaseId: string): Promise<boolean>;
}

/** Runtime bearers start with this prefix: recognisable in logs and secret scanners, never an API key. */
export const RUNTIME_BEARER_PREFIX = 'ap_rt';

/**
 * Runtime bearers in Redis: `ap:{a:<digest>}:runtime` → the grant (JSON), with a TTL equal to
 * `expires_at`, and (with a fence) valid only while the lease holds the Session's fence. A different key than API credentials (`:cred`), so a runtime
 * bearer never authenticates anywhere else (in particular not on /v1/mcp), and an API key is
 * never a runtime bearer. The secret itself is never stored.
 */
export class RedisRuntimeBearers implements RuntimeBearerVerifier {
  /**
   * With `fence`, a bearer also dies the moment its lease stops holding the Session's fence
   * (lost, expired without renewal, released, or taken over by a newer lease), before its
   * own TTL and without anyone calling `revoke`.
   */
  constructor(
    private readonly redis: Redis,
    private readonly fence?: LeaseHolder,
  ) {}

  private static key(bearer: string): string {
    const digest = secretDigest(bearer);
    return keys.scoped(tags.auth(digest), 'runtime');
  }

  /** Mint a bearer for one lease. Called by the lease work when it grants a lease; returned once. */
  async mint(grant: RuntimeGrant): Promise<string> {
    const ttlMs = Date.parse(grant.expires_at) - Date.now();
    if (!(ttlMs > 0)) throw new Error('a runtime bearer must expire in the future');
    const bearer = newSecret(RUNTIME_BEARER_PREFIX);
    await this.redis.set(RedisRuntimeBearers.key(bearer), JSON.stringify(grant), 'PX', Math.ceil(ttlMs));
    return bearer;
  }

  /** Revoke at once (lease released, lost or fenced by a newer epoch). */
  async revoke(bearer: string): Promise<void> {
    await this.redis.del(RedisRuntimeBearers.key(bearer));
  }

  async verify(bearer: string): Promise<RuntimeGrant | null> {
    if (!bearer.startsWith(`${RUNTIME_BEARER_PREFIX}_`)) return null;
    const raw = await this.redis.get(RedisRuntimeBearers.key(bearer));
    if (raw === null) return null;
    const grant = JSON.parse(raw) as RuntimeGrant;
    if (!(Date.parse(grant.expires_at) > Date.now())) return null;
    if (this.fence && !(await this.fence.holds(grant.session_id, grant.lease_id))) return null;
    return grant;
  }
}

/** The permission a grant gives one upstream tool. */
export function permissionOf(grant: ConnectionGrant, tool: string): ToolPermission {
  return grant.tools?.[tool] ?? grant.default;
}
