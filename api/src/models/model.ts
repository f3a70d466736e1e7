import type { StoredDoc } from '@agentplane/store';
import type { ProviderKey } from '@agentplane/models';

/** The fields a stored credential and its secret-free head share. */
interface ModelCredentialFields {
  workspace_id: string;
  key: string;
  display_name: string;
  provider_key: ProviderKey;
  base_url: string | null;
  custody_policy: 'workspace_vault';
  status: 'active' | 'revoked';
  health_status: 'unknown' | 'healthy' | 'unhealthy';
  active_generation_number: number;
  revoked_at: string | null;
}

/** A ModelCredential as stored. The provider secret is never in this document (see secrets in credentials.ts). */
export interface ModelCredentialDoc extends StoredDoc, ModelCredentialFields {
  /** Whether the active generation holds a secret (keyless local servers and `scripted` do not). */
  has_secret: boolean;
}

/** The secret-free head: exactly the contract's fields. */
export interface ModelCredentialHead extends ModelCredentialFields {
  id: string;
  resource_version: number;
  created_at: string;
  updated_at: string;
}

export function credentialHead(d: ModelCredentialDoc): ModelCredentialHead {
  return {
    id: d.id, workspace_id: d.workspace_id, key: d.key, display_name: d.display_name, provider_key: d.provider_key,
    base_url: d.base_url, custody_policy: d.custody_policy, status: d.status, health_status: d.health_status,
    active_generation_number: d.active_generation_number, resource_version: d.version,
    created_at: d.created_at, updated_at: d.updated_at, revoked_at: d.revoked_at,
  };
}

/** What a candidate can do and what it may cost; a request that does not fit skips it. */
export interface CandidateConstraints {
  /** The model can call tools (default true). Requests that offer tools skip candidates with false. */
  tool_use?: boolean;
  /** Context window in tokens: the estimated request plus `max_output_tokens` must fit. */
  context_window_tokens?: number;
  /** Price ceilings (USD per million tokens, from the price table); an unpriced model fails a ceiling. */
  max_input_usd_per_mtok?: number;
  max_output_usd_per_mtok?: number;
}

export interface RoutingCandidate {
  credential_key: string;
  provider_model: string;
  constraints?: CandidateConstraints;
}

export interface RoutingProfileDoc extends StoredDoc {
  type: 'model_routing_profile';
  workspace_id: string;
  key: string;
  display_name: string;
  latest_revision_number: number;
}

/** An immutable revision of a routing profile. */
export interface RoutingRevision {
  type: 'model_routing_profile_revision';
  model_routing_profile_id: string;
  workspace_id: string;
  revision_number: number;
  candidates: RoutingCandidate[];
  created_at: string;
}

export interface RoutingProfileView {
  id: string;
  type: 'model_routing_profile';
  workspace_id: string;
  key: string;
  display_name: string;
  latest_revision_number: number;
  candidates: RoutingCandidate[];
  resource_version: number;
  created_at: string;
  updated_at: string;
}

export function profileView(d: RoutingProfileDoc, latest: RoutingRevision): RoutingProfileView {
  return {
    id: d.id, type: d.type, workspace_id: d.workspace_id, key: d.key, display_name: d.display_name,
    latest_revision_number: d.latest_revision_number, candidates: latest.candidates, resource_version: d.version,
    created_at: d.created_at, updated_at: d.updated_at,
  };
}
