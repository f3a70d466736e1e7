import { Page, PageQuery, Type } from '@agentplane/core';
import { READERS, WRITERS } from '../http/caller.js';
import { defineOperation, json, type Operation } from '../http/operation.js';
import { pageOf, workspaceRead, workspaceWrite } from '../http/workspace-operation.js';
import { requireWorkspace } from '../http/workspace-scope.js';
import { checkMultiagent, newAgent, normaliseMcp, normaliseTools } from '@agentplane/domain';
import { AgentPath, AgentSchema, AgentVersionPath, CreateAgentBody, UpdateAgentBody } from './schemas.js';
import { createVersioned } from '../http/keyed-create.js';

const readers = { kind: 'bearer', roles: READERS } as const;
const writers = { kind: 'bearer', roles: WRITERS } as const;

export const agentOperations: Operation[] = [
  workspaceWrite('POST', {
    operationId: 'agents.createAgent', path: '/v1/agents', summary: 'Create an Agent (version 1)',
    audit: { target: 'response' },
    auth: writers, body: CreateAgentBody, response: AgentSchema, successStatus: 201, idempotency: 'optional', mcp: 'compact',
  }, async (ws, { body, keyed, deps }) => {
    await deps.models.profiles.requireKey(ws, body.model, 'body.model');
    if (body.skills) await deps.skills.checkSelections(ws, body.skills, 'body.skills');
    if (body.multiagent) await checkMultiagent(body.multiagent, body.tools ?? [], (id, v) => deps.agents.getVersion(ws, id, v));
    return createVersioned(deps.agents, ws, newAgent(ws, body), 'agent', keyed, 'agent-created');
  }),
  workspaceRead({
    operationId: 'agents.listAgents', path: '/v1/agents', summary: 'List the Agents of the Workspace (latest versions)',
    auth: readers, query: PageQuery({ include_archived: Type.Optional(Type.Boolean({ default: false })) }), response: Page(AgentSchema), mcp: 'compact',
  }, (ws, { query, deps }) => deps.agents.list(ws, { limit: query.limit ?? 20, page: query.page, includeArchived: query.include_archived ?? false })),
  workspaceRead({
    operationId: 'agents.getAgent', path: '/v1/agents/{agent_id}', summary: 'Read the latest version of an Agent',
    auth: { ...readers, principal: true }, permission: { action: 'read', target: 'agent_id' }, mcpPrincipal: true,
    params: AgentPath, response: AgentSchema, mcp: 'compact',
  }, (ws, { params, deps }) => deps.agents.get(ws, params.agent_id)),
  defineOperation({
    operationId: 'agents.updateAgent', method: 'POST', path: '/v1/agents/{agent_id}',
    audit: { target: 'agent_id' },
    summary: 'Publish a new immutable version of an Agent; earlier versions never change', auth: writers, params: AgentPath,
    body: UpdateAgentBody, response: AgentSchema, idempotency: 'optional', mcp: 'compact',
    async handler({ caller, params, body, deps, keyed }) {
      const { expected_version, ...patch } = body;
      const ws = requireWorkspace(caller);
      if (patch.model !== undefined) await deps.models.profiles.requireKey(ws, patch.model, 'body.model');
      if (patch.skills !== undefined) await deps.skills.checkSelections(ws, patch.skills, 'body.skills');
      if (patch.multiagent) {
        const tools = patch.tools ?? (await deps.agents.get(ws, params.agent_id)).tools;
        await checkMultiagent(patch.multiagent, tools, (id, v) => deps.agents.getVersion(ws, id, v));
      } else if (patch.tools !== undefined && patch.multiagent === undefined) {
        // New tools of a coordinator that stays one: its roster is carried over, its tools checked against it.
        const { multiagent } = await deps.agents.get(ws, params.agent_id);
        if (multiagent) await checkMultiagent(multiagent, patch.tools, (id, v) => deps.agents.getVersion(ws, id, v));
      }
      return json(200, await deps.agents.newVersion(ws, params.agent_id, expected_version, (cur) => ({
        ...cur,
        ...(patch.name !== undefined ? { name: patch.name } : {}),
        ...(patch.description !== undefined ? { description: patch.description } : {}),
        ...(patch.model !== undefined ? { model: patch.model } : {}),
        ...(patch.system !== undefined ? { system: patch.system } : {}),
        ...(patch.tools !== undefined ? { tools: normaliseTools(patch.tools) } : {}),
        ...(patch.mcp_servers !== undefined ? { mcp_servers: normaliseMcp(patch.mcp_servers) } : {}),
        ...(patch.skills !== undefined ? { skills: patch.skills } : {}),
        ...(patch.metadata !== undefined ? { metadata: patch.metadata } : {}),
        ...(patch.multiagent !== undefined ? { multiagent: patch.multiagent ?? undefined } : {}),
      }), keyed?.write('agent')));
    },
  }),
  workspaceWrite('POST', {
    operationId: 'agents.archiveAgent', path: '/v1/agents/{agent_id}/archive',
    audit: { target: 'agent_id' },
    summary: 'Archive an Agent: no new Sessions or versions; existing Sessions keep their snapshot', auth: writers,
    params: AgentPath, response: AgentSchema, idempotency: 'optional', mcp: 'full',
  }, (ws, { params, deps }) => deps.agents.archive(ws, params.agent_id)),
  workspaceRead({
    operationId: 'agents.listAgentVersions', path: '/v1/agents/{agent_id}/versions',
    summary: 'List the versions of an Agent, oldest first', auth: readers, params: AgentPath, query: PageQuery({}),
    response: Page(AgentSchema), mcp: 'full',
  }, (ws, { params, query, deps }) => deps.agents.listVersions(ws, params.agent_id, pageOf(query))),
  workspaceRead({
    operationId: 'agents.getAgentVersion', path: '/v1/agents/{agent_id}/versions/{version}',
    summary: 'Read one immutable Agent version', auth: readers, params: AgentVersionPath, response: AgentSchema, mcp: 'full',
  }, (ws, { params, deps }) => deps.agents.getVersion(ws, params.agent_id, params.version)),
];
