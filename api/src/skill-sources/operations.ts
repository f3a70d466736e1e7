import { Id, Obj, Page, PageQuery, Timestamp, Type } from '@agentplane/core';
import { READERS, WRITERS } from '../http/caller.js';
import { defineOperation, json, type Operation } from '../http/operation.js';
import { requireWorkspace } from '../http/workspace-scope.js';

const readers = { kind: 'bearer', roles: READERS } as const;
const writers = { kind: 'bearer', roles: WRITERS } as const;

export const SkillSourceSchema = Obj({
  id: Id('skillSource'),
  type: Type.Literal('skill_source'),
  workspace_id: Id('workspace'),
  name: Type.String(),
  url: Type.String(),
  default_branch: Type.String(),
  path: Type.String(),
  version: Type.Integer({ minimum: 1 }),
  created_at: Timestamp(),
  updated_at: Timestamp(),
});

const SourcePath = Obj({ skill_source_id: Id('skillSource') });

/** Skill sources: git repositories skills are submitted to and adopted from (docs/SKILLS.md). */
export const skillSourceOperations: Operation[] = [
  defineOperation({
    operationId: 'skillSources.createSkillSource', method: 'POST', path: '/v1/skill-sources', summary: 'Register a git repository as a skill source',
    audit: { target: 'response' }, auth: writers, idempotency: 'optional', mcp: 'full', successStatus: 201,
    body: Obj({
      name: Type.String({ minLength: 1, maxLength: 200 }),
      url: Type.String({ minLength: 1, maxLength: 2048 }),
      default_branch: Type.Optional(Type.String({ minLength: 1, maxLength: 200 })),
      path: Type.Optional(Type.String({ minLength: 1, maxLength: 200 })),
    }),
    response: SkillSourceSchema,
    async handler({ caller, body, deps }) {
      return json(201, await deps.skillSources.create(requireWorkspace(caller), body));
    },
  }),
  defineOperation({
    operationId: 'skillSources.listSkillSources', method: 'GET', path: '/v1/skill-sources', summary: 'List the skill sources of the Workspace',
    auth: readers, query: PageQuery({}), response: Page(SkillSourceSchema), mcp: 'full',
    async handler({ caller, query, deps }) {
      return json(200, await deps.skillSources.list(requireWorkspace(caller), { limit: query.limit ?? 20, page: query.page }));
    },
  }),
  defineOperation({
    operationId: 'skillSources.getSkillSource', method: 'GET', path: '/v1/skill-sources/{skill_source_id}', summary: 'Read a skill source',
    auth: readers, params: SourcePath, response: SkillSourceSchema, mcp: 'full',
    async handler({ caller, params, deps }) {
      return json(200, await deps.skillSources.get(requireWorkspace(caller), params.skill_source_id));
    },
  }),
  defineOperation({
    operationId: 'skillSources.syncSkillSource', method: 'POST', path: '/v1/skill-sources/{skill_source_id}/sync',
    summary: 'Check the source\'s default branch now for submitted skills that were merged (adoption)',
    audit: { target: 'skill_source_id' }, auth: writers, params: SourcePath, mcp: 'full', successStatus: 200,
    response: Obj({ adopted_skill_proposal_ids: Type.Array(Id('skillProposal')) }),
    async handler({ caller, params, deps }) {
      return json(200, { adopted_skill_proposal_ids: await deps.skillProposals.syncSource(requireWorkspace(caller), params.skill_source_id) });
    },
  }),
];
