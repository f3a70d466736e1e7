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

/**
 * Every operation group of the table belongs to exactly one area (a unit test holds it to that),
 * so what the report says is served cannot drift from what the router serves.
 */
export const CAPABILITY_AREAS: CapabilityArea[] = [
  { area: 'identity', readiness: 'alpha', description: 'Organizations, workspaces, API keys, Principals, access credentials', groups: ['organizations', 'apiKeys', 'principals'] },
  { area: 'sessions', readiness: 'unavailable', description: 'Agents, environments, sandbox profiles, Sessions, threads, event streams', groups: ['agents', 'environments', 'sandboxProfiles', 'sessions', 'threads'] },
  { area: 'runs', readiness: 'unavailable', description: 'Runs leased to runners', groups: ['runs'] },
  { area: 'runners', readiness: 'unavailable', description: 'Runner pools, pairing, credentials, presence', groups: ['runners', 'runnerPools', 'runnerPairings', 'runnerCredentials'] },
  { area: 'model_access', readiness: 'unavailable', description: 'Model credentials, routing profiles, usage, budgets', groups: ['models'] },
  { area: 'mcp', readiness: 'alpha', description: 'POST /v1/mcp, Connections (external MCP servers) and the runtime MCP endpoint', groups: ['connections'] },
  { area: 'files', readiness: 'unavailable', description: 'Files: upload, read, delete', groups: ['files'] },
  { area: 'memory', readiness: 'unavailable', description: 'Memory stores, vaults and projects', groups: ['memoryStores', 'vaults', 'projects'] },
  { area: 'skills', readiness: 'unavailable', description: 'Skills and skill sources', groups: ['skills', 'skillSources'] },
  { area: 'skill_proposals', readiness: 'unavailable', description: 'Model-curated skill authoring', groups: ['skillProposals'] },
  { area: 'automations', readiness: 'unavailable', description: 'Automations (schedules, signed webhooks, firings, traces, feedback) and outbound webhook endpoints', groups: ['automations', 'automationFirings', 'webhookEndpoints'] },
  { area: 'governance', readiness: 'unavailable', description: 'Permission assignments, action policies, approvals, the audit log', groups: ['permissionAssignments', 'actionPolicies', 'approvals', 'audit'] },
  { area: 'collaboration', readiness: 'unavailable', description: 'Surface scopes and agent installations on them', groups: ['surfaceScopes', 'agentInstallations', 'externalInstallations'] },
  { area: 'agent_deployments', readiness: 'unavailable', description: 'Deployment heads and revisions, harness profiles, connected harnesses', groups: ['agentDeployments', 'harnessProfiles', 'connectedHarnesses'] },
  { area: 'a2a', readiness: 'unavailable', description: 'External A2A agents as tool sources (the A2A server itself answers at /a2a/v1/…, outside the operation table)', groups: ['toolSources'] },
  { area: 'support', readiness: 'alpha', description: 'This report and the OpenAPI document', groups: ['support', 'meta'] },
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
