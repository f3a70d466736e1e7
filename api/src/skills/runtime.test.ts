import { describe, expect, it } from 'vitest';
import type Koa from 'koa';
import type { RuntimeGrant } from '@agentplane/domain';
import type { ApiDeps } from '../deps.js';
import { runtimeSkills } from './runtime.js';

const grant = { run_id: 'run_1', session_id: 'sess_1', workspace_id: 'wrkspc_1', organization_id: 'org_1', lease_id: 'l', expires_at: '2999-01-01T00:00:00Z', connections: {}, skills: [] } as unknown as RuntimeGrant;

/** One request through the route, with a bearer whose grant names no skill. */
async function get(path: string): Promise<unknown> {
  const route = runtimeSkills({} as ApiDeps, { verify: () => Promise.resolve(grant) });
  const ctx = { path, method: 'GET', headers: { authorization: 'Bearer runtime-token' }, set: () => undefined } as unknown as Koa.Context;
  try {
    await route(ctx, () => Promise.resolve());
    return null;
  } catch (err) {
    return err;
  }
}

describe('GET /v1/runtime/skills/{ref}', () => {
  it('answers a reference that is not percent-encoded text as a client error, never a 500', async () => {
    for (const path of ['/v1/runtime/skills/%E0%A4%A', '/v1/runtime/skills/%', '/v1/runtime/skills/skill_%zz']) {
      expect(await get(path), path).toMatchObject({ type: 'validation.malformed', status: 400 });
    }
    expect(await get(`/v1/runtime/skills/skill_${'a'.repeat(32)}@1`)).toMatchObject({ type: 'validation.not_found', status: 404 });
  });
});
