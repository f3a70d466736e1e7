import { afterAll, describe, expect, it } from 'vitest';
import { sha256Hex } from '@agentplane/core';
import { cardJson, signCard, signingKey, startCardPeer, type CardPeer } from './harness/a2a-peer.js';
import { crashedKeyed, useCrashPlatforms, type CrashPlatform } from './harness/crash-platform.js';
import { waitFor } from './harness/platform.js';
import { authorInstructions, type Json } from './harness/turns.js';

/**
 * The API killed right after a keyed create of a resource that hangs off another one wrote it: a
 * deployment's connection binding, a tool source's Connection, a skill proposal and a firing's
 * feedback label (crash points `connection-binding-created`, `tool-source-connection-created`,
 * `skill-proposal-created`, `firing-feedback-created`), the key's pending record gone as it goes
 * once its owner is dead (here removed, as its expiry would). The retry of the same request under
 * the key finds what its first attempt wrote (its id derived from the key and the request) and
 * answers it, 201 as the first attempt would have; there is one of it, not two. A binding's key
 * and a Principal's label of a firing are unique: the retry was refused 409 before; another
 * request for them still is. So is an agent deployment's id (fixed by its Workspace and Agent:
 * `agent-deployment-created`): the retry is answered the one its first attempt made, another
 * request's create is refused.
 */
const POINTS = ['connection-binding-created', 'tool-source-connection-created', 'skill-proposal-created', 'firing-feedback-created'];
/** The skill proposal create's service version. */
const PROPOSAL_VERSION = { 'service-version': '2026-08-29' };
/** The proposals whose work the sweep resumes (docs/SKILLS.md, "Queue and keys"). */
const OUTBOX = 'ap:{g:skill_proposal_outbox}:skill_proposal_outbox';

let peer: CardPeer | undefined;
afterAll(async () => {
  await peer?.close();
});

/** `crashedKeyed` for a JSON create at `path`. */
function crashedCreate(q: CrashPlatform, point: string, path: string, body: Json, key: string, headers: Record<string, string> = {}): Promise<void> {
  return crashedKeyed(q, point, key, () => q.p.root.request('POST', path, { body, idempotencyKey: key, headers }), { probePath: '/v1/agents' });
}

describe('a crash inside a keyed create of a dependent resource', () => {
  const crash = useCrashPlatforms('keyed-create-crash-dependents');

  it('a connection binding, a tool source Connection, a skill proposal and a firing feedback label are each made once, answered to the retry', async () => {
    const [q, key] = await Promise.all([
      crash.start(POINTS, { env: { LOG_LEVEL: 'warn', AGENTPLANE_MODE: 'development', AUTOMATION_SWEEP_MS: '500' } }),
      signingKey('keyed'),
    ]);
    peer = await startCardPeer();
    peer.card = await signCard(cardJson(peer.rpcUrl), key);
    const api = q.p.root;
    const ws = q.p.bootstrap.workspace_id;
    const redis = q.redis();
    const agent = (await api.post<{ id: string }>('/v1/agents', { name: 'dependents', model: 'default', system: 'Be brief.' })).id;
    const envId = (await api.post<{ id: string }>('/v1/environments', {
      name: 'sandbox', image: 'agentplane/sandbox:latest', resources: { cpu_millis: 1000, memory_mib: 256, disk_mib: 512, max_duration_seconds: 120 },
    })).id;
    const principal = async (principal_type: string, name: string) => (await api.post<{ id: string }>(`/v1/organizations/workspaces/${ws}/principals`, {
      external_subject_id: `${name}-${Math.random()}`, principal_type, display_name: name,
    })).id;

    // ---- A connection binding: its key is unique among the deployment's bindings.
    {
      const conn = (await api.post<{ id: string }>('/v1/connections', { name: 'upstream', url: 'http://127.0.0.1:9/mcp' })).id;
      const adep = (await api.post<{ id: string }>(`/v1/organizations/workspaces/${ws}/agent-deployments`, { agent_id: agent, key: 'dependents' })).id;
      const path = `/v1/agent-deployments/${adep}/connection-bindings`;
      const body = { agent_deployment_id: adep, integration_connection_id: conn, key: 'keyed' };
      const held = () => redis.hget(`ap:{w:${ws}}:uniq:agent_deployment_connection_binding_keys:${adep}`, 'keyed');
      const indexed = () => redis.zrange(`ap:{w:${ws}}:idx:agent_deployment_connection_bindings:${adep}`, 0, -1);
      await crashedCreate(q, 'connection-binding-created', path, body, 'k-binding');
      const written = await held();
      expect(written).toMatch(/^adcb_[0-9a-f]{32}$/);
      expect(await indexed()).toEqual([written]);
      // The retry was refused 409 for the key its first attempt had claimed; now it is answered.
      const retry = await api.request<{ id: string; key: string; resource_version: number }>('POST', path, { body, idempotencyKey: 'k-binding' });
      expect([retry.status, retry.body.id, retry.body.key, retry.body.resource_version]).toEqual([201, written, 'keyed', 1]);
      expect(await indexed()).toEqual([written]);
      expect((await api.get<{ id: string }>(`/v1/agent-deployment-connection-bindings/${written}`)).id).toBe(written);
      // Another request for the same key is still refused for it.
      const other = await api.request<{ error: { type: string } }>('POST', path, { body, idempotencyKey: 'k-binding-other' });
      expect([other.status, other.body.error?.type]).toEqual([409, 'validation.conflict']);
    }

    // ---- A tool source's Connection.
    {
      await api.post('/v1/provider-packages', { name: 'peer', package_version: 1, card_url: peer.cardUrl, rpc_url: peer.rpcUrl });
      const source = (await api.post<{ id: string }>('/v1/tool-sources', { name: 'peer', provider: 'peer', source: { kind: 'a2a', card_url: peer.cardUrl, verification_keys: [key.jwk] } })).id;
      expect((await api.request('POST', `/v1/tool-sources/${source}/sync`, { body: {} })).status).toBe(200);
      const path = `/v1/tool-sources/${source}/connections`;
      const mine = async () => (await api.get<{ data: { id: string; name: string }[] }>(path, { limit: 100 })).data.filter((c) => c.name === 'keyed').map((c) => c.id);
      await crashedCreate(q, 'tool-source-connection-created', path, { name: 'keyed' }, 'k-tool-connection');
      const written = await mine();
      expect(written).toHaveLength(1);
      expect(written[0]).toMatch(/^conn_[0-9a-f]{32}$/);
      const retry = await api.request<{ id: string; version: number; tool_source_id: string }>('POST', path, { body: { name: 'keyed' }, idempotencyKey: 'k-tool-connection' });
      expect([retry.status, retry.body.id, retry.body.version, retry.body.tool_source_id]).toEqual([201, written[0], 1, source]);
      expect(await mine()).toEqual(written);
    }

    // ---- A skill proposal: the first attempt died before queueing its authoring.
    {
      const session = (await api.post<{ id: string }>('/v1/sessions', { agent, environment_id: envId })).id;
      const answer = { name: 'keyed-greeting', description: 'Greets once.', instructions: 'Greet.', task: 'Greet Ada.', rubric: '- Greets Ada' };
      const body = { source_session_ids: [session], model_routing_profile_key: 'default', instructions: authorInstructions(answer) };
      const mine = async () => (await api.get<{ data: { id: string }[] }>('/v1/skill-proposals', { limit: 100 })).data.map((x) => x.id);
      await crashedCreate(q, 'skill-proposal-created', '/v1/skill-proposals', body, 'k-proposal', PROPOSAL_VERSION);
      const written = await mine();
      expect(written).toHaveLength(1);
      expect(written[0]).toMatch(/^skp_[0-9a-f]{32}$/);
      // The sweep's entry gone, only the retry can queue the authoring its first attempt never queued.
      await redis.zrem(OUTBOX, `${ws}/${written[0]}`);
      const retry = await api.request<{ id: string; status: string }>('POST', '/v1/skill-proposals', { body, idempotencyKey: 'k-proposal', headers: PROPOSAL_VERSION });
      expect([retry.status, retry.body.id]).toEqual([201, written[0]]);
      const drafted = await waitFor('the proposal authored', async () => {
        const x = await api.get<{ status: string; skill?: { name: string } }>(`/v1/skill-proposals/${written[0]}`);
        return x.status !== 'authoring' ? x : undefined;
      }, 60_000);
      expect([drafted.status, drafted.skill?.name]).toEqual(['drafted', 'keyed-greeting']);
      expect(await mine()).toEqual(written);
      // Another retry once it is drafted (its own authoring moved it on, no client did) is still answered it.
      await redis.del(`ap:{w:${ws}}:idem:${sha256Hex('k-proposal')}`);
      const late = await api.request<{ id: string; status: string }>('POST', '/v1/skill-proposals', { body, idempotencyKey: 'k-proposal', headers: PROPOSAL_VERSION });
      expect([late.status, late.body.id, late.body.status]).toEqual([201, written[0], 'drafted']);
      expect(await mine()).toEqual(written);
    }

    // ---- A firing's feedback label: one per Principal per firing.
    {
      // No `invoke` grant: the firing is refused at admission, which finishes it without a turn.
      const service = await principal('service', 'robot');
      const person = await principal('person', 'reviewer');
      const automation = (await api.post<{ id: string }>('/v1/automations', {
        name: 'labelled', principal_id: service, agent, environment_id: envId, prompt: 'look at {{event}}', trigger: { type: 'webhook' },
      })).id;
      const firing = (await api.post<{ id: string }>(`/v1/automations/${automation}/fire`, {})).id;
      await waitFor('the firing refused', async () => ((await api.get<{ status: string }>(`/v1/automation-firings/${firing}`)).status === 'refused' ? true : undefined), 30_000);
      const path = `/v1/automation-firings/${firing}/feedback`;
      const body = { authored_by: person, disposition: 'useful' };
      const mine = async () => (await api.get<{ data: { id: string }[] }>(path, { limit: 100 })).data.map((x) => x.id);
      await crashedCreate(q, 'firing-feedback-created', path, body, 'k-feedback');
      const written = await mine();
      expect(written).toHaveLength(1);
      expect(written[0]).toMatch(/^afbk_[0-9a-f]{32}$/);
      // The retry was refused 409 for the Principal's label its first attempt had written; now it is answered.
      const retry = await api.request<{ id: string; version: number; disposition: string }>('POST', path, { body, idempotencyKey: 'k-feedback' });
      expect([retry.status, retry.body.id, retry.body.version, retry.body.disposition]).toEqual([201, written[0], 1, 'useful']);
      expect(await mine()).toEqual(written);
      // Another request for the Principal's label is still refused.
      const other = await api.request<{ error: { type: string } }>('POST', path, { body: { authored_by: person, disposition: 'noisy' }, idempotencyKey: 'k-feedback-other' });
      expect([other.status, other.body.error?.type]).toEqual([409, 'validation.conflict']);
    }
  }, 240_000);

  // A platform of its own: the platform gives up on an api that crashed five times within a minute.
  it('an agent deployment, whose id is fixed by its Workspace and Agent, is answered to the retry; another request\'s create is refused', async () => {
    const q = await crash.start(['agent-deployment-created'], { env: { LOG_LEVEL: 'warn' } });
    const api = q.p.root;
    const ws = q.p.bootstrap.workspace_id;
    {
      const deployed = (await api.post<{ id: string }>('/v1/agents', { name: 'deployed', model: 'default' })).id;
      const path = `/v1/organizations/workspaces/${ws}/agent-deployments`;
      const body = { agent_id: deployed, key: 'keyed-deployment' };
      const mine = async () => (await api.get<{ data: { id: string }[] }>(path, { limit: 100, key: 'keyed-deployment' })).data.map((x) => x.id);
      await crashedCreate(q, 'agent-deployment-created', path, body, 'k-deployment');
      const written = await mine();
      expect(written).toHaveLength(1);
      // The retry was refused 409 for the id its first attempt had taken; now it is answered.
      const retry = await api.request<{ id: string; resource_version: number; current_revision_number: number }>('POST', path, { body, idempotencyKey: 'k-deployment' });
      expect([retry.status, retry.body.id, retry.body.resource_version, retry.body.current_revision_number]).toEqual([201, written[0], 1, 0]);
      expect(await mine()).toEqual(written);
      // Another request's create of the same deployment is still refused.
      const other = await api.request<{ error: { type: string } }>('POST', path, { body, idempotencyKey: 'k-deployment-other' });
      expect([other.status, other.body.error?.type]).toEqual([409, 'validation.conflict']);
    }
  }, 240_000);
});
