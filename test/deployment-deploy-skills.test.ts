import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { HttpClient } from '@agentplane/client';
import { startPlatform, type Platform } from './harness/platform.js';
import { developerWorkspace, type Json } from './harness/turns.js';

/**
 * `POST /v1/agents/{id}/deploy` pins the skills the release selects: the exact-pin revision's
 * `skill_selections` are the release's skills, by name and version in the target Workspace (as
 * the profiles it names by key), so the deployment's Sessions carry them as the Agent version
 * does. A skill the target lacks (or has archived, or not at that version) leaves the head only.
 */
let p: Platform;
let api: HttpClient;
let ws: string;

type Rev = { revision_number: number; skill_selections: Json[] };
type Deployed = { outcome: string; agent_deployment: { id: string; current_revision_number: number }; revision: Rev | null; missing_profiles: string[] };
const skillMd = (name: string, description: string) => `---\nname: ${name}\ndescription: ${description}\n---\n\nDo it well.\n`;

beforeAll(async () => {
  p = await startPlatform();
  ({ api } = await developerWorkspace(p, 'deploy-skills'));
  ws = p.bootstrap.workspace_id;
  for (const kind of ['harness', 'sandbox'] as const) {
    const body = kind === 'harness' ? { key: 'default', kind: 'builtin' } : { key: 'default', image: 'agentplane/sandbox:latest' };
    expect((await p.root.request('POST', `/v1/organizations/workspaces/${ws}/${kind}-profiles`, { body })).status).toBe(201);
  }
}, 120_000);
afterAll(async () => {
  await p?.stop();
});

describe('deploy of a release that selects skills', () => {
  it("pins the release's skills; a skill the target lacks leaves the head only", async () => {
    const skill = await api.post<{ id: string }>('/v1/skills', { files: [{ path: 'SKILL.md', content: skillMd('greeter', 'Greets people.') }] });
    await api.post('/v1/skills', { files: [{ path: 'SKILL.md', content: skillMd('greeter', 'Greets people, v2.') }] });
    const agent = (await api.post<{ id: string }>('/v1/agents', { name: 'skilled', model: 'default', skills: [{ name: 'greeter', version: 1 }] })).id;
    const deploy = (target = ws) => p.root.request<Deployed>('POST', `/v1/agents/${agent}/deploy`, { body: { agent_release_number: 1, target_workspace_id: target } });

    const published = await deploy();
    expect(published.status).toBe(200);
    expect(published.body.outcome).toBe('published');
    expect(published.body.revision?.skill_selections).toEqual([{ skill_id: skill.id, skill_revision_number: 1 }]);
    const s = await api.post<{ agent: { skills?: Json[] } }>(`/v1/agent-deployments/${published.body.agent_deployment.id}/sessions`, {});
    expect(s.agent.skills).toEqual([{ name: 'greeter', version: 1 }]);
    expect((await deploy()).body.outcome).toBe('unchanged');

    // Another Workspace of the Organization without the skill: the head only, naming it.
    const target = (await p.root.post<{ id: string }>(`/v1/organizations/${p.bootstrap.organization_id}/workspaces`, { name: 'deploy-skills-target' })).id;
    for (const kind of ['harness', 'sandbox'] as const) {
      const body = kind === 'harness' ? { key: 'default', kind: 'builtin' } : { key: 'default', image: 'agentplane/sandbox:latest' };
      expect((await p.root.request('POST', `/v1/organizations/workspaces/${target}/${kind}-profiles`, { body })).status).toBe(201);
    }
    const lacking = await deploy(target);
    expect(lacking.status).toBe(200);
    expect(lacking.body).toMatchObject({ outcome: 'head_only', revision: null, missing_profiles: ['skill:greeter@1'] });
    expect(lacking.body.agent_deployment.current_revision_number).toBe(0);

    // Archived in the Agent's own Workspace: not selectable any more, so not deployed either.
    expect((await api.request('POST', `/v1/skills/${skill.id}/archive`)).status).toBe(200);
    const archived = await deploy();
    expect(archived.body).toMatchObject({ outcome: 'head_only', missing_profiles: ['skill:greeter@1'] });
  });
});
