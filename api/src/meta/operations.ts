import { Obj, Type } from '@agentplane/core';
import { READERS } from '../http/caller.js';
import { CURRENT_VERSION, defineOperation, json, type Operation } from '../http/operation.js';
import { openApiDocument } from './openapi.js';

export type Readiness = 'alpha' | 'preview' | 'unavailable';

/** Capability areas of the contract and what this deployment serves of each. */
export interface CapabilityArea {
  area: string;
  readiness: Readiness;
  description: string;
  /** operationId group prefixes that belong to the area. */
  groups: string[];
}

export const CAPABILITY_AREAS: CapabilityArea[] = [
  { area: 'identity', readiness: 'alpha', description: 'Organizations, workspaces, API keys, Principals, access credentials', groups: ['organizations', 'apiKeys', 'principals'] },
  { area: 'sessions', readiness: 'unavailable', description: 'Agents, environments, Sessions, threads, event streams', groups: ['agents', 'environments', 'sessions', 'threads'] },
  { area: 'runs', readiness: 'unavailable', description: 'Runs leased to runners', groups: ['runs'] },
  { area: 'runners', readiness: 'unavailable', description: 'Runner pools, pairing, presence', groups: ['runners', 'runnerPools', 'runnerPairings'] },
  { area: 'model_access', readiness: 'unavailable', description: 'Model credentials, routing profiles, usage, budgets', groups: ['models', 'modelCredentials', 'modelRoutingProfiles', 'usage'] },
  { area: 'mcp', readiness: 'alpha', description: 'POST /v1/mcp, Connections (external MCP servers) and the runtime MCP endpoint', groups: ['mcp', 'connections'] },
  { area: 'skill_proposals', readiness: 'unavailable', description: 'Model-curated skill authoring', groups: ['skillProposals'] },
  { area: 'automations', readiness: 'unavailable', description: 'Automations (schedules, signed webhooks, firings, traces, feedback) and outbound webhook endpoints', groups: ['automations', 'automationFirings', 'webhookEndpoints'] },
  { area: 'governance', readiness: 'unavailable', description: 'Permission assignments, action policies, approvals', groups: ['approvals', 'policies'] },
  { area: 'collaboration', readiness: 'unavailable', description: 'Surface scopes', groups: ['surfaceScopes'] },
  { area: 'agent_deployments', readiness: 'unavailable', description: 'Deployment heads and revisions', groups: ['agentDeployments'] },
  { area: 'a2a', readiness: 'unavailable', description: 'A2A server and external A2A tool sources', groups: ['a2a'] },
];

export function metaOperations(all: () => readonly Operation[]): Operation[] {
  return [
    defineOperation({
      operationId: 'meta.openapi', method: 'GET', path: '/v1/openapi.json', summary: 'The OpenAPI 3.1 document of this API',
      auth: { kind: 'none' }, versions: null, mcp: 'never',
      async handler({ deps }) {
        return json(200, openApiDocument(all(), deps.config.publicBaseUrl));
      },
    }),
    defineOperation({
      operationId: 'support.getCapabilities', method: 'GET', path: '/v1/support/capabilities',
      summary: 'What this deployment serves, per capability area, with its readiness',
      auth: { kind: 'bearer', roles: [...READERS, 'runner'], principal: true, runner: true },
      response: Obj({
        service_version: Type.String(),
        data: Type.Array(Obj({ area: Type.String(), readiness: Type.String(), description: Type.String(), operations: Type.Array(Type.String()) })),
      }),
      mcp: 'compact',
      async handler() {
        const ops = all();
        const data = CAPABILITY_AREAS.map((a) => {
          const operations = ops.filter((o) => a.groups.includes(o.operationId.split('.')[0] ?? '')).map((o) => o.operationId);
          return { area: a.area, readiness: operations.length > 0 ? (a.readiness === 'unavailable' ? 'alpha' : a.readiness) : 'unavailable', description: a.description, operations };
        });
        return json(200, { service_version: CURRENT_VERSION, data });
      },
    }),
  ];
}
