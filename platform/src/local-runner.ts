import { existsSync, readFileSync } from 'node:fs';
import { hostname } from 'node:os';
import { secretDigest, type Logger } from '@agentplane/core';
import { keys, type Redis } from '@agentplane/store';
import type { RunnerService } from '@agentplane/domain';
import { credentialPath, saveCredential, type RunnerCredentialFile } from '@agentplane/protocol';

/**
 * The local runner of `npm start`: a Workspace-scoped credential in the default pool of the
 * bootstrap workspace, minted through the service layer and stored 0600 under the data dir.
 * Reused across restarts while it is still live; re-minted when revoked or lost.
 */
export async function ensureLocalRunner(
  redis: Redis,
  runners: RunnerService,
  workspaceId: string,
  dir: string,
  baseUrl: string,
  log: Logger,
): Promise<void> {
  const file = credentialPath(dir);
  if (existsSync(file)) {
    const current = JSON.parse(readFileSync(file, 'utf8')) as RunnerCredentialFile;
    const live = (await redis.exists(keys.auth(secretDigest(current.secret)))) === 1;
    if (live && current.workspace_id === workspaceId) {
      if (current.base_url !== baseUrl) saveCredential(dir, { ...current, base_url: baseUrl });
      return;
    }
    log.warn({ runner: current.runner_id }, 'local runner credential is no longer live; minting a new one');
  }
  const label = `local:${hostname()}`;
  const { runner_credential: rc, secret } = await runners.mintLocal(workspaceId, label);
  saveCredential(dir, {
    base_url: baseUrl, secret, runner_id: rc.runner_id, runner_credential_id: rc.id, runner_pool_id: rc.runner_pool_id,
    workspace_id: workspaceId, machine_label: label, paired_at: rc.created_at,
  });
  log.info({ runner: rc.runner_id, pool: rc.runner_pool_id }, 'local runner credential minted');
}
