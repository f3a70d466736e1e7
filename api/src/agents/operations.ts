import { Page, PageQuery, Type } from '@agentplane/core';
import { READERS, WRITERS } from '../http/caller.js';
import { defineOperation, json, type Operation } from '../http/operation.js';
import { requireWorkspace } from '../http/workspace-scope.js';
import { checkMultiagent, newAgent, normaliseMcp, normaliseTools } from '@agentplane/domain';
import { AgentPath, AgentSchema, AgentVersionPath, CreateAgentBody, UpdateAgentBody } from './schemas.js';

const readers = { kind: 'bearer', roles: READERS } as const;
const writers = { kind: 'bearer', roles: WRITERS } as const;

export const agentOperations: Operation[] = [
  defineOperation({
    operationId: 'agents.createAgent', method: 'POST', path: '/v1/agents', summary: 'Create an Agent (version 1)',
    audit: { target: 'response' },
    auth: writers, body: CreateAgentBody, response: AgentSchema, successStatus: 201, idempotency: 'optional', mcp: 'compact',
    async handler({ caller, body, deps }) {
      const ws = requireWorkspace(caller);
      await deps.models.profiles.requireKey(ws, body.model, 'body.model');
      if (body.skills) await deps.skills.checkSelections(ws, body.skills, 'body.skills');
      if (body.multiagent) await checkMultiagent(body.multiagent, body.tools ?? [], (id, v) => deps.agents.getVersion(ws, id, v));
      return json(201, await deps.agents.create(ws, newAgent(ws, body)));
    },
  }),
  defineOperation({
    operationId: 'agents.listAgents', method: 'GET', path: '/v1/agents', summary: 'List the Agents of the Workspace (latest versions)',
    auth: readers, query: PageQuery({ include_archived: Type.Optional(Type.Boolean()) }), response: Page(AgentSchema), mcp: 'compact',
    async handler({ caller, query, deps }) {
      const ws = requireWorkspace(caller);
      return json(200, await deps.agents.list(ws, { limit: query.limit ?? 20, page: query.page, includeArchived: query.include_archived ?? false }));
    },
  }),
  defineOperation({
    operationId: 'agents.getAgent', method: 'GET', path: '/v1/agents/{agent_id}', summary: 'Read the latest version of an Agent',
    auth: { ...readers, principal: true }, permission: { action: 'read', target: 'agent_id' }, mcpPrincipal: true,
    params: AgentPath, response: AgentSchema, mcp: 'compact',
    async handler({ caller, params, deps }) {
      return json(200, await deps.agents.get(requireWorkspace(caller), params.agent_id));
    },
  }),
  defineOperation({
    operationId: 'agents.updateAgent', method: 'POST', path: '/v1/agents/{agent_id}',
    audit: { target: 'agent_id' },
    summary: 'Publish a new immutable version of an Agent; earlier versions never change', auth: writers, params: AgentPath,
    body: UpdateAgentBody, response: AgentSchema, idempotency: 'optional', mcp: 'compact',
    async handler({ caller, params, body, deps }) {
      const { expected_version, ...patch } = body;
      const ws = requireWorkspace(caller);
      if (patch.model !== undefined) await deps.models.profiles.requireKey(ws, patch.model, 'body.model');
      if (patch.skills !== undefined) await deps.skills.checkSelections(ws, patch.skills, 'body.skills');
      if (patch.multiagent) {
        const tools = patch.tools ?? (await deps.agents.get(ws, params.agent_id)).tools;
        await checkMultiagent(patch.multiagent, tools, (id, v) => deps.agents.getVersion(ws, id, v));
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
      })));
    },
  }),
  defineOperation({
    operationId: 'agents.archiveAgent', method: 'POST', path: '/v1/agents/{agent_id}/archive',
    audit: { target: 'agent_id' },
    summary: 'Archive an Agent: no new Sessions or versions; existing Sessions keep their snapshot', auth: writers,
    params: AgentPath, response: AgentSchema, idempotency: 'optional', mcp: 'full',
    async handler({ caller, params, deps }) {
      return json(200, await deps.agents.archive(requireWorkspace(caller), params.agent_id));
    },
  }),
  defineOperation({
    operationId: 'agents.listAgentVersions', method: 'GET', path: '/v1/agents/{agent_id}/versions',
    summary: 'List the versions of an Agent, oldest first', auth: readers, params: AgentPath, query: PageQuery({}),
    response: Page(AgentSchema), mcp: 'full',
    async handler({ caller, params, query, deps }) {
      return json(200, await deps.agents.listVersions(requireWorkspace(caller), params.agent_id, { limit: query.limit ?? 20, page: query.page }));
    },
  }),
  defineOperation({
    operationId: 'agents.getAgentVersion', method: 'GET', path: '/v1/agents/{agent_id}/versions/{version}',
    summary: 'Read one immutable Agent version', auth: readers, params: AgentVersionPath, response: AgentSchema, mcp: 'full',
    async handler({ caller, params, deps }) {
      return json(200, await deps.agents.getVersion(requireWorkspace(caller), params.agent_id, params.version));
    },
  }),
];
