import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { Redis } from 'ioredis';
import { startPlatform, type Platform } from './harness/platform.js';
import { errType } from './harness/governance.js';

// SurfaceScope and AgentInstallation writes racing each other, and claims left by a create that
// died half-way, black-box against a real platform.

type Json = Record<string, unknown>;
type Scope = { id: string; state: string; kind: string };

let p: Platform;
let ws: string;
let redis: Redis;
let envId: string;
let agentId: string;

const post = <T = Json>(path: string, body: unknown) => p.root.request<T>('POST', path, { body });
async function created<T extends { id: string }>(path: string, body: unknown): Promise<T> {
  const r = await post<T>(path, body);
  expect(r.status, JSON.stringify(r.body)).toBe(201);
  return r.body;
}
const installation = (externalId: string) => created<{ id: string }>('/v1/external-installations', { provider: 'race', external_id: externalId, display_name: externalId });

beforeAll(async () => {
  p = await startPlatform();
  ws = p.bootstrap.workspace_id;
  redis = new Redis(p.redisUrl());
  envId = (await p.root.post<{ id: string }>('/v1/environments', { name: 'surf-race-env', image: 'agentplane/sandbox:1' })).id;
  agentId = (await p.root.post<{ id: string }>('/v1/agents', { name: 'surf-race-agent', model: 'default' })).id;
});
afterAll(async () => {
  redis?.disconnect();
  await p?.stop();
});

describe('SurfaceScope races and claims', () => {
  it('a child created while its parent is archived never stays active under an archived parent', async () => {
    const exti = (await installation('archive-race')).id;
    const root = await created<Scope>('/v1/surface-scopes', { kind: 'root', external_installation_id: exti, display_name: 'root' });
    let archivedFirst = 0;
    let createdFirst = 0;
    for (let i = 0; i < 20; i++) {
      const team = await created<Scope>('/v1/surface-scopes', { kind: 'team', parent_id: root.id, external_installation_id: exti, display_name: `team ${i}` });
      const [archive, child] = await Promise.all([
        post<Scope>(`/v1/surface-scopes/${team.id}/archive`, {}),
        post<Scope>('/v1/surface-scopes', { kind: 'channel', parent_id: team.id, external_installation_id: exti, display_name: `channel ${i}` }),
      ]);
      // Exactly one of the two wins: an archived parent refuses the child, a child refuses the archive.
      if (archive.status === 200) {
        archivedFirst++;
        expect([child.status, errType(child)]).toEqual([409, 'runtime.invalid_transition']);
      } else {
        createdFirst++;
        expect([archive.status, errType(archive)]).toEqual([409, 'runtime.invalid_transition']);
        expect(child.status).toBe(201);
        expect((await p.root.get<Scope>(`/v1/surface-scopes/${team.id}`)).state).toBe('active');
        expect((await post<Scope>(`/v1/surface-scopes/${child.body.id}/archive`, {})).status).toBe(200);
        expect((await post<Scope>(`/v1/surface-scopes/${team.id}/archive`, {})).status).toBe(200);
      }
    }
    expect(archivedFirst + createdFirst).toBe(20);
  });

  it('a root, an external id or an installation key claimed for nothing is released by the next create', async () => {
    const none = (prefix: string) => `${prefix}_${'0'.repeat(32)}`;
    const held = (collection: string, field: string) => redis.hget(`ap:{w:${ws}}:uniq:${collection}`, field);

    await redis.hset(`ap:{w:${ws}}:uniq:external_installation_keys`, 'race\u0000orphaned', none('exti'));
    const exti = await installation('orphaned');
    expect(await held('external_installation_keys', 'race\u0000orphaned')).toBe(exti.id);
    const dupInstallation = await post('/v1/external-installations', { provider: 'race', external_id: 'orphaned', display_name: 'again' });
    expect([dupInstallation.status, errType(dupInstallation)]).toEqual([409, 'validation.conflict']);

    await redis.hset(`ap:{w:${ws}}:uniq:surface_scope_roots`, exti.id, none('surf'));
    await redis.hset(`ap:{w:${ws}}:uniq:surface_scope_external:${exti.id}`, 'R-1', none('surf'));
    const root = await created<Scope>('/v1/surface-scopes', { kind: 'root', external_installation_id: exti.id, external_id: 'R-1', display_name: 'root' });
    expect(await held('surface_scope_roots', exti.id)).toBe(root.id);
    expect(await held(`surface_scope_external:${exti.id}`, 'R-1')).toBe(root.id);

    const secondRoot = await post('/v1/surface-scopes', { kind: 'root', external_installation_id: exti.id, display_name: 'again' });
    expect([secondRoot.status, errType(secondRoot)]).toEqual([409, 'validation.conflict']);
    const sameExternal = await post('/v1/surface-scopes', { kind: 'team', parent_id: root.id, external_installation_id: exti.id, external_id: 'R-1', display_name: 'again' });
    expect([sameExternal.status, errType(sameExternal)]).toEqual([409, 'validation.conflict']);
    // A refused create claims nothing.
    const team = await created<Scope>('/v1/surface-scopes', { kind: 'team', parent_id: root.id, external_installation_id: exti.id, external_id: 'T-1', display_name: 'team' });
    expect(await held(`surface_scope_external:${exti.id}`, 'T-1')).toBe(team.id);
    const channel = await post('/v1/surface-scopes', { kind: 'channel', parent_id: team.id, external_installation_id: exti.id, external_id: 'C-1', display_name: 'late' });
    expect(channel.status).toBe(201);
    expect((await post(`/v1/surface-scopes/${(channel.body as Scope).id}/archive`, {})).status).toBe(200);
    expect((await post(`/v1/surface-scopes/${team.id}/archive`, {})).status).toBe(200);
    const refused = await post('/v1/surface-scopes', { kind: 'channel', parent_id: team.id, external_installation_id: exti.id, external_id: 'C-2', display_name: 'refused' });
    expect([refused.status, errType(refused)]).toEqual([409, 'runtime.invalid_transition']);
    expect(await held(`surface_scope_external:${exti.id}`, 'C-2')).toBeNull();
  });

  it('an AgentInstallation listed by SurfaceScope is on that scope, whatever order racing re-scopes finished in', async () => {
    const exti = (await installation('rescope-race')).id;
    const root = await created<Scope>('/v1/surface-scopes', { kind: 'root', external_installation_id: exti, display_name: 'root' });
    const teams: string[] = [];
    for (let i = 0; i < 6; i++) teams.push((await created<Scope>('/v1/surface-scopes', { kind: 'team', parent_id: root.id, external_installation_id: exti, display_name: `team ${i}` })).id);
    for (let round = 0; round < 3; round++) {
      const inst = await created<{ id: string }>('/v1/agent-installations', { agent: { id: agentId }, environment_id: envId, surface_scope_ids: [root.id] });
      const moves = await Promise.all(teams.map((t) => post(`/v1/agent-installations/${inst.id}`, { surface_scope_ids: [t] })));
      for (const m of moves) expect(m.status).toBe(200);
      const now = await p.root.get<{ surface_scope_ids: string[] }>(`/v1/agent-installations/${inst.id}`);
      expect(now.surface_scope_ids).toHaveLength(1);
      for (const s of [root.id, ...teams]) {
        const listed = await p.root.get<{ data: { id: string }[] }>('/v1/agent-installations', { surface_scope_id: s, limit: 100 });
        expect(listed.data.some((x) => x.id === inst.id), `listed on ${s}`).toBe(now.surface_scope_ids.includes(s));
      }
      expect((await post(`/v1/agent-installations/${inst.id}/archive`, {})).status).toBe(200);
    }
  });
});
