import { Id, Obj, Page, PageQuery, Timestamp, Type } from '@agentplane/core';
import { READERS, WRITERS } from '../http/caller.js';
import { createOnce } from '../http/keyed-create.js';
import type { Operation } from '../http/operation.js';
import { pageOf, workspaceRead, workspaceWrite } from '../http/workspace-operation.js';

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
  workspaceWrite('POST', {
    operationId: 'skillSources.createSkillSource', path: '/v1/skill-sources', summary: 'Register a git repository as a skill source',
    audit: { target: 'response' }, auth: writers, idempotency: 'optional', mcp: 'full', successStatus: 201,
    body: Obj({
      name: Type.String({ minLength: 1, maxLength: 200 }),
      url: Type.String({ minLength: 1, maxLength: 2048 }),
      default_branch: Type.Optional(Type.String({ minLength: 1, maxLength: 200 })),
      path: Type.Optional(Type.String({ minLength: 1, maxLength: 200 })),
    }),
    response: SkillSourceSchema,
  }, (ws, { body, deps, keyed }) => createOnce('skillSource', keyed, (id) => deps.skillSources.find(ws, id), (id) => deps.skillSources.create(ws, body, id), 'skill-source-created')),
  workspaceRead({
    operationId: 'skillSources.listSkillSources', path: '/v1/skill-sources', summary: 'List the skill sources of the Workspace',
    auth: readers, query: PageQuery({}), response: Page(SkillSourceSchema), mcp: 'full',
  }, (ws, { query, deps }) => deps.skillSources.list(ws, pageOf(query))),
  workspaceRead({
    operationId: 'skillSources.getSkillSource', path: '/v1/skill-sources/{skill_source_id}', summary: 'Read a skill source',
    auth: readers, params: SourcePath, response: SkillSourceSchema, mcp: 'full',
  }, (ws, { params, deps }) => deps.skillSources.get(ws, params.skill_source_id)),
  workspaceWrite('POST', {
    operationId: 'skillSources.syncSkillSource', path: '/v1/skill-sources/{skill_source_id}/sync',
    summary: 'Check the source\'s default branch now for submitted skills that were merged (adoption)',
    audit: { target: 'skill_source_id' }, auth: writers, params: SourcePath, mcp: 'full', successStatus: 200,
    response: Obj({ adopted_skill_proposal_ids: Type.Array(Id('skillProposal')) }),
  }, async (ws, { params, deps }) => ({ adopted_skill_proposal_ids: await deps.skillProposals.syncSource(ws, params.skill_source_id) })),
];
