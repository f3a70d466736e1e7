import type { StoredDoc } from '@agentplane/store';

export type PoolPlacement = 'byoc' | 'managed';

export interface DrainState {
  requested_at: string;
  /** After the deadline held work is canceled. */
  deadline: string;
  reason: string;
}

/** A group of runners that Runs are scheduled onto. Every Workspace has a default BYOC pool. */
export interface RunnerPool extends StoredDoc {
  type: 'runner_pool';
  workspace_id: string;
  name: string;
  placement: PoolPlacement;
  is_default: boolean;
  status: 'active' | 'draining';
  drain: DrainState | null;
}

/** A pending or redeemed pairing. The code itself is never stored, only its digest. */
export interface RunnerPairing extends StoredDoc {
  type: 'runner_pairing';
  workspace_id: string;
  organization_id: string;
  runner_pool_id: string;
  principal_id: string;
  machine_label: string;
  code_digest: string;
  status: 'pending' | 'redeemed';
  expires_at: string;
  redeemed_at: string | null;
  runner_credential_id: string | null;
}

export interface RunnerOwner {
  principal: string;
  machine_label: string;
}

/** The bearer a runner daemon connects with. Workspace-scoped; owner-scoped when paired by a Principal. */
export interface RunnerCredential extends StoredDoc {
  type: 'runner_credential';
  workspace_id: string;
  runner_pool_id: string;
  /** The runner this credential is; stable across reconnects (presence `runner`). */
  runner_id: string;
  placement: PoolPlacement;
  owner: RunnerOwner | null;
  display_name: string;
  issued_via: 'pairing' | 'enrollment' | 'local';
  pairing_id: string | null;
  status: 'active' | 'revoked';
  secret_hint: string;
  revoked_at: string | null;
  drain: DrainState | null;
}
