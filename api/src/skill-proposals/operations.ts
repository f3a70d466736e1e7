import { ApiError, Id, LogicalKey, Nullable, Obj, Page, PageQuery, Timestamp, Type } from '@agentplane/core';
import { defineOperation, json, type Operation } from '../http/operation.js';
import { pageOf, workspaceRead, workspaceWrite } from '../http/workspace-operation.js';
import { READERS, WRITERS, type Caller } from '../http/caller.js';
import { requireWorkspace } from '../http/workspace-scope.js';
import { isBranchName } from '../skill-sources/service.js';

const readers = { kind: 'bearer', roles: READERS } as const;
const writers = { kind: 'bearer', roles: WRITERS } as const;

/** The contract lists `2026-08-29` as the only value of the create operation's version header. */
export const SKILL_PROPOSAL_CREATE_VERSION = '2026-08-29';

const Usage = Obj({
  input_tokens: Type.Integer({ minimum: 0 }), cached_input_tokens: Type.Integer({ minimum: 0 }), cache_write_input_tokens: Type.Integer({ minimum: 0 }),
  output_tokens: Type.Integer({ minimum: 0 }), reasoning_output_tokens: Type.Integer({ minimum: 0 }), total_tokens: Type.Integer({ minimum: 0 }),
});
const Digest = () => Type.String({ pattern: '^sha256:[0-9a-f]{64}$' });
const CommitSha = () => Type.String({ pattern: '^(?:[0-9a-f]{40}|[0-9a-f]{64})$' });
const BaseDigest = () => Type.String({ pattern: '^(?:sha256:[0-9a-f]{64}|git-sha1:[0-9a-f]{40}|git-sha256:[0-9a-f]{64})$' });

export const SkillProposalSchema = Obj({
  id: Id('skillProposal'),
  status: Type.Union(['authoring', 'drafted', 'authoring_failed', 'verifying', 'verified', 'verification_failed', 'submitting', 'submitted', 'discarded'].map((s) => Type.Literal(s))),
  source_session_ids: Type.Array(Id('session'), { minItems: 1, maxItems: 8 }),
  agent: Id('agent'),
  model_routing_profile_key: LogicalKey(),
  instructions: Nullable(Type.String({ maxLength: 4096 })),
  skill: Type.Optional(Obj({ name: LogicalKey(), description: Type.String(), kind: Type.Literal('instructional'), entry: Type.String(), content_sha256: Digest() })),
  verification_material: Type.Optional(Obj({ task: Type.String(), rubric: Type.String() })),
  verifications: Type.Array(Obj({
    session: Id('session'), started_at: Timestamp(), launched_at: Nullable(Timestamp()), source_version: Type.Integer({ minimum: 1 }), principal: Id('principal'),
    result: Nullable(Obj({ verdict: Type.String(), explanation: Nullable(Type.String()), cost_tokens: Type.Integer({ minimum: 0 }), completed_at: Timestamp() })),
  })),
  submission: Type.Optional(Obj({ skill_source: Id('skillSource'), branch: Type.String(), commit_sha: CommitSha(), submitted_at: Timestamp() })),
  adoption: Type.Optional(Obj({ skill_id: Id('skill'), skill_version: Type.Integer({ minimum: 1 }), observed_at: Timestamp() })),
  error: Type.Optional(Type.Union(['input_session_unavailable', 'input_sessions_too_large', 'authoring_failed', 'internal'].map((s) => Type.Literal(s)))),
  usage: Usage,
  created_at: Timestamp(),
  updated_at: Timestamp(),
  version: Type.Integer({ minimum: 1 }),
  submission_attempt: Type.Optional(Obj({
    source_version: Type.Integer({ minimum: 1 }), skill_source: Id('skillSource'), acted_as: Id('principal'), branch: Type.String(),
    base_commit_sha: CommitSha(), base_content_sha256: Digest(), expected_base_digest: Nullable(BaseDigest()), prepared_commit_sha: CommitSha(), started_at: Timestamp(),
  })),
});

const ProposalPath = Obj({ id: Id('skillProposal') });

/** The requester: the body's `principal`, else the calling Principal credential's own. */
function principalOf(caller: Caller, given: string | undefined): string {
  const p = given ?? caller.principalId ?? undefined;
  if (!p) throw new ApiError('validation.malformed', 'body.principal: required when the caller is not a Principal');
  return p;
}

/**
 * Skill proposals (contract: "Skill proposals"; designed parts in docs/SKILLS.md): create
 * (authoring starts), read, list, verify, submit to a skill source, discard.
 */
export const skillProposalOperations: Operation[] = [
  workspaceWrite('POST', {
    operationId: 'skillProposals.createSkillProposal', path: '/v1/skill-proposals', summary: 'Propose a skill authored from up to 8 Session logs',
    versions: [SKILL_PROPOSAL_CREATE_VERSION], audit: { target: 'response' }, auth: writers, idempotency: 'optional', mcp: 'full', successStatus: 201,
    body: Obj({
      source_session_ids: Type.Array(Id('session'), { minItems: 1, maxItems: 8, uniqueItems: true }),
      model_routing_profile_key: LogicalKey(),
      instructions: Type.Optional(Type.String({ minLength: 1, maxLength: 4096 })),
      skill_name: Type.Optional(LogicalKey()),
    }),
    response: SkillProposalSchema,
  }, async (ws, { body, deps, keyed }) =>
    // Made once per keyed request: the retry of a create that died after writing (crash point
    // `skill-proposal-created`) is answered the proposal it wrote, its authoring queued if need be.
    deps.skillProposals.view(await deps.skillProposals.create(ws, body, keyed))),
  workspaceRead({
    operationId: 'skillProposals.listSkillProposals', path: '/v1/skill-proposals', summary: 'List the skill proposals of the Workspace',
    auth: readers, query: PageQuery({}), response: Page(SkillProposalSchema), mcp: 'full',
  }, async (ws, { query, deps }) => {
    const page = await deps.skillProposals.list(ws, pageOf(query));
    const data = await Promise.all(page.data.map(async (p) => deps.skillProposals.view(await deps.skillProposals.reconcile(ws, p))));
    return { data, next_page: page.next_page };
  }),
  workspaceRead({
    operationId: 'skillProposals.getSkillProposal', path: '/v1/skill-proposals/{id}', summary: 'Read a skill proposal (a finished verification is reconciled on read)',
    auth: readers, params: ProposalPath, response: SkillProposalSchema, mcp: 'full',
  }, async (ws, { params, deps }) => deps.skillProposals.view(await deps.skillProposals.get(ws, params.id))),
  defineOperation({
    operationId: 'skillProposals.verifySkillProposal', method: 'POST', path: '/v1/skill-proposals/{id}/verify',
    summary: 'Verify the drafted skill in one isolated Session graded by the Outcome grader (resumable)',
    audit: { target: 'id' }, auth: writers, params: ProposalPath, idempotency: 'optional', mcp: 'full', successStatus: 200,
    // The verification Session's drive, made by the handler for the requester: the same drive
    // ActionPolicy check as `POST /v1/sessions/{id}/events` with this event by that Principal.
    actionPolicy: { type: 'user.define_outcome', authorField: 'principal' },
    body: Obj({ expected_version: Type.Integer({ minimum: 1 }), principal: Type.Optional(Id('principal')) }),
    response: SkillProposalSchema,
    async handler({ caller, params, body, deps }) {
      const p = await deps.skillProposals.verify(requireWorkspace(caller), params.id, { expected_version: body.expected_version, principal: principalOf(caller, body.principal) });
      return json(200, deps.skillProposals.view(p));
    },
  }),
  defineOperation({
    operationId: 'skillProposals.submitSkillProposal', method: 'POST', path: '/v1/skill-proposals/{id}/submit',
    summary: 'Commit a verified skill to a new branch of a skill source (compare-and-swap on the base; resumable)',
    audit: { target: 'id' }, auth: writers, params: ProposalPath, idempotency: 'optional', mcp: 'full', successStatus: 200,
    body: Obj({
      expected_version: Type.Integer({ minimum: 1 }),
      skill_source: Id('skillSource'),
      principal: Type.Optional(Id('principal')),
      branch: Type.Optional(Type.String({ minLength: 1, maxLength: 200 })),
      expected_base_digest: Type.Optional(Nullable(BaseDigest())),
    }),
    response: SkillProposalSchema,
    async handler({ caller, params, body, deps }) {
      if (body.branch !== undefined && !isBranchName(body.branch)) throw new ApiError('validation.malformed', 'body.branch: not a git branch name');
      const p = await deps.skillProposals.submit(requireWorkspace(caller), params.id, { ...body, principal: principalOf(caller, body.principal) });
      return json(200, deps.skillProposals.view(p));
    },
  }),
  workspaceWrite('POST', {
    operationId: 'skillProposals.discardSkillProposal', path: '/v1/skill-proposals/{id}/discard',
    summary: 'Discard a skill proposal that is not authoring, verifying, submitting or submitted',
    audit: { target: 'id' }, auth: writers, params: ProposalPath, idempotency: 'optional', mcp: 'full', successStatus: 200,
    body: Obj({ expected_version: Type.Integer({ minimum: 1 }) }),
    response: SkillProposalSchema,
  }, async (ws, { params, body, deps }) => deps.skillProposals.view(await deps.skillProposals.discard(ws, params.id, body.expected_version))),
];
