import type { StoredDoc } from '@agentplane/store';
import type { CallerKind, Role } from './roles.js';

export type TenancyStatus = 'active' | 'disabled';

export interface Organization extends StoredDoc {
  type: 'organization';
  name: string;
  status: TenancyStatus;
  default_workspace_id: string;
}

export interface Workspace extends StoredDoc {
  type: 'workspace';
  organization_id: string;
  name: string;
  status: TenancyStatus;
}

export type KeyScope = { type: 'organization' } | { type: 'workspace'; workspace_id: string };

export interface ApiKey extends StoredDoc {
  type: 'api_key';
  organization_id: string;
  display_name: string;
  role: Role;
  scope: KeyScope;
  rate_limit_per_minute: number | null;
  status: 'active' | 'revoked';
  generation_number: number;
  /** Last four characters of the live secret, to tell keys apart. */
  secret_hint: string;
  revoked_at: string | null;
}

export interface Principal extends StoredDoc {
  type: 'principal';
  workspace_id: string;
  external_subject_id: string;
  principal_type: 'person' | 'service';
  display_name: string;
  status: 'active' | 'suspended' | 'deleted';
  suspended_at: string | null;
  deleted_at: string | null;
}

export interface PrincipalAccessCredential extends StoredDoc {
  type: 'principal_access_credential';
  workspace_id: string;
  principal_id: string;
  audience: 'api_mcp' | 'a2a';
  status: 'active' | 'revoked';
  generation_number: number;
  secret_hint: string;
  rotated_at: string | null;
  revoked_at: string | null;
}

/** What a bearer digest resolves to; kept beside the digest so one GET authenticates. */
export interface AuthRecord {
  kind: Exclude<CallerKind, 'anonymous'>;
  credential_id: string;
  organization_id: string;
  /** null for organization-scoped API keys. */
  workspace_id: string | null;
  role: Role | null;
  principal_id: string | null;
  audience: 'api_mcp' | 'a2a' | null;
  rate_limit_per_minute: number | null;
  generation_number: number;
  /** The credential document's version the record was written from (absent on older records). */
  document_version?: number;
}

/** Hide internal fields: documents are stored with nothing secret, so the view is the doc itself. */
export function apiKeyView(k: ApiKey): ApiKey {
  return k;
}
