import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { HttpClient } from '@agentplane/client';
import { startPlatform, waitFor, type Platform } from './harness/platform.js';
import { authorInstructions, developerWorkspace, untilEvents, type Json } from './harness/turns.js';
import { createPrincipal, errMsg, errType } from './harness/governance.js';

/**
 * Verifying a skill proposal drives its verification Session with `user.define_outcome`,
 * authored by the request's Principal. That drive passes the Workspace's ActionPolicies exactly
 * as a REST drive of the same event by the same Principal would: a `deny` or a
 * `require_approval` refuses the verify (403 `policy.denied`) before anything is recorded, and
 * no verification Session is made. No runner: nothing here needs a turn to run.
 */
let p: Platform;
let api: HttpClient;
let principal: string;
let envId: string;
let agentId: string;
let sourceSession: string;

type Proposal = Json & { id: string; status: string; version: number; verifications: Array<Json & { session: string }> };

const CREATE = { 'service-version': '2026-08-29' };

const AUTHORED = {
  name: 'polite-greeting', description: 'Greets visitors politely.', instructions: 'Say hello and the visitor\'s name.',
  task: 'Greet the visitor named Ada.', rubric: '- The answer greets Ada',
};

async function policy(body: Json): Promise<{ id: string; version: number }> {
  const r = await p.root.request<{ id: string; version: number }>('POST', '/v1/action-policies', { body });
  expect(r.status).toBe(201);
  return r.body;
}
const dropPolicy = (id: string) => p.root.request('DELETE', `/v1/action-policies/${id}`);

async function drafted(): Promise<Proposal> {
  const created = await api.request<Proposal>('POST', '/v1/skill-proposals', {
    body: { source_session_ids: [sourceSession], model_routing_profile_key: 'default', instructions: authorInstructions(AUTHORED) }, headers: CREATE,
  });
  expect(created.status).toBe(201);
  return waitFor('the proposal to draft', async () => {
    const x = await api.get<Proposal>(`/v1/skill-proposals/${created.body.id}`);
    if (x.status === 'authoring') return undefined;
    expect(x.status).toBe('drafted');
    return x;
  }, 60_000);
}

const verify = (id: string, body: Json) => api.request<Proposal>('POST', `/v1/skill-proposals/${id}/verify`, { body });

/** The proposal is as it was: still drafted at the same version, no attempt, so no verification Session. */
async function untouched(before: Proposal): Promise<void> {
  const now = await api.get<Proposal>(`/v1/skill-proposals/${before.id}`);
  expect(now).toMatchObject({ status: 'drafted', version: before.version, verifications: [] });
  const sessions = await api.get<{ data: Array<Json & { metadata: Json }> }>(`/v1/sessions?agent_id=${agentId}&limit=100`);
  expect(sessions.data.filter((s) => s.metadata.skill_proposal_id === before.id)).toEqual([]);
}

beforeAll(async () => {
  p = await startPlatform();
  ({ api, principal, envId } = await developerWorkspace(p, 'skill-proposal-drive-policy'));
  agentId = (await api.post<{ id: string }>('/v1/agents', { name: 'greeter', model: 'default' })).id;
  // An empty source Session is enough: the scripted author answers from the instructions.
  sourceSession = (await api.post<{ id: string }>('/v1/sessions', { agent: agentId, environment_id: envId })).id;
}, 120_000);
afterAll(async () => {
  await p?.stop();
});

describe('skill proposal verification and the drive ActionPolicy', () => {
  it('a deny of the user.define_outcome drive for the requester refuses the verify; nothing is recorded', async () => {
    const x = await drafted();
    const rule = await policy({ effect: 'deny', tool: { kind: 'drive', name: 'user.define_outcome' }, principal_id: principal });
    try {
      const r = await verify(x.id, { expected_version: x.version, principal });
      expect(r.status).toBe(403);
      expect(errType(r)).toBe('policy.denied');
      expect(errMsg(r)).toContain(rule.id);
      await untouched(x);
      // Exactly what a REST drive of the same event by the same Principal gets.
      const s = (await api.post<{ id: string }>('/v1/sessions', { agent: agentId, environment_id: envId })).id;
      const drive = await api.request('POST', `/v1/sessions/${s}/events`, {
        body: { type: 'user.define_outcome', payload: { description: 'd', rubric: 'r', max_iterations: 1, authored_by: principal, caused_by: { kind: 'api' } } },
      });
      expect([drive.status, errType(drive)]).toEqual([r.status, errType(r)]);
      expect(errMsg(drive)).toContain(rule.id);
      // The same request through POST /v1/mcp meets the same check.
      const viaMcp = await fetch(`${p.baseUrl}/v1/mcp`, {
        method: 'POST',
        headers: { authorization: `Bearer ${p.bootstrap.root_key}`, 'content-type': 'application/json', 'mcp-protocol-version': '2025-11-25' },
        body: JSON.stringify({
          jsonrpc: '2.0', id: 1, method: 'tools/call',
          params: { name: 'skillProposals_verifySkillProposal', arguments: { path: { id: x.id }, body: { expected_version: x.version, principal }, idempotency_key: 'mcp-verify-1' } },
        }),
      });
      const result = ((await viaMcp.json()) as { result: { isError?: boolean; content: Array<{ text: string }> } }).result;
      expect(result.isError).toBe(true);
      expect(JSON.parse(result.content[0]?.text ?? '{}').error.type).toBe('policy.denied');
      await untouched(x);
    } finally {
      await dropPolicy(rule.id);
    }
  });

  it("each decision on the verify's drive is an audit record naming the skill proposal", async () => {
    const refusedOne = await drafted();
    const deny = await policy({ effect: 'deny', tool: { kind: 'drive', name: 'user.define_outcome' }, principal_id: principal });
    try {
      expect((await verify(refusedOne.id, { expected_version: refusedOne.version, principal })).status).toBe(403);
    } finally {
      await dropPolicy(deny.id);
    }
    const allowedOne = await drafted();
    const allow = await policy({ effect: 'allow', tool: { kind: 'drive', name: 'user.define_outcome' }, principal_id: principal });
    try {
      expect((await verify(allowedOne.id, { expected_version: allowedOne.version, principal })).status).toBe(200);
    } finally {
      await dropPolicy(allow.id);
    }
    type Row = { action: string; target: string | null; outcome: string; detail: string | null; request_id: string | null };
    const decisions = async (target: string) => (await p.root.post<{ data: Row[] }>('/v1/audit/export', { target, action: 'policy.drive:user.define_outcome' })).data;
    expect((await decisions(refusedOne.id)).map((r) => [r.outcome, r.detail])).toEqual([['denied', deny.id]]);
    expect((await decisions(allowedOne.id)).map((r) => [r.outcome, r.detail])).toEqual([['allowed', allow.id]]);
  });

  it('a require_approval matching the drive refuses it too (nobody can approve at this boundary)', async () => {
    const x = await drafted();
    const rule = await policy({ effect: 'require_approval', tool: { kind: 'drive', name: 'user.*' } });
    try {
      const r = await verify(x.id, { expected_version: x.version, principal });
      expect(r.status).toBe(403);
      expect(errType(r)).toBe('policy.denied');
      expect(errMsg(r)).toContain('approval');
      await untouched(x);
    } finally {
      await dropPolicy(rule.id);
    }
  });

  it("the drive is the requester's: another Principal's deny leaves it alone, and the Session gets the drive", async () => {
    const x = await drafted();
    const other = await createPrincipal(p.root, p.bootstrap.workspace_id, 'someone-else');
    const rule = await policy({ effect: 'deny', tool: { kind: 'drive', name: 'user.define_outcome' }, principal_id: other });
    try {
      const r = await verify(x.id, { expected_version: x.version, principal });
      expect(r.status).toBe(200);
      expect(r.body.status).toBe('verifying');
      const session = r.body.verifications.at(-1)?.session ?? '';
      const events = await untilEvents(api, session, (e) => e.some((x) => x.type === 'user.define_outcome'), 30_000);
      expect(events.filter((e) => e.type === 'user.define_outcome').map((e) => e.payload.authored_by)).toEqual([principal]);
    } finally {
      await dropPolicy(rule.id);
    }
  });
});
