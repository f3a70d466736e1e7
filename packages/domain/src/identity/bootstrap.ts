import { keys, type Redis } from '@agentplane/store';
import type { IdentityService } from './service.js';

export interface BootstrapResult {
  organization_id: string;
  workspace_id: string;
  /** Present only on the first boot of an empty store. */
  root_key?: string;
}

const MARKER = keys.global('bootstrap');

/**
 * First boot on an empty store: one Organization, its default Workspace, and an
 * organization-scoped root key whose secret is returned exactly once. Later boots return
 * the ids only. Safe when several processes race: one claims the marker.
 */
export async function bootstrapPlatform(redis: Redis, identity: IdentityService): Promise<BootstrapResult> {
  const existing = await redis.get(MARKER);
  if (existing && existing !== 'pending') return JSON.parse(existing) as BootstrapResult;
  const claimed = await redis.set(MARKER, 'pending', 'EX', 60, 'NX');
  if (claimed !== 'OK') {
    for (let i = 0; i < 100; i++) {
      await new Promise((r) => setTimeout(r, 100));
      const v = await redis.get(MARKER);
      if (v && v !== 'pending') return JSON.parse(v) as BootstrapResult;
    }
    throw new Error('another process is bootstrapping this store and did not finish');
  }
  const { org, workspace } = await identity.createOrganization('Default organization', 'default');
  const { key, secret } = await identity.createApiKey(org.id, { display_name: 'bootstrap root key', role: 'root', scope: { type: 'organization' } });
  const ids = { organization_id: org.id, workspace_id: workspace.id, root_key_id: key.id };
  await redis.set(MARKER, JSON.stringify(ids));
  return { organization_id: org.id, workspace_id: workspace.id, root_key: secret };
}
