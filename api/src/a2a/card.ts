import { AgentCard, type AgentSkill } from '@a2a-js/sdk';
import { sha256Hex } from '@agentplane/core';
import { endpointPath, type Placement } from './placement.js';

export const A2A_VERSION = '1.0';
export const TEXT_PLAIN = 'text/plain';
/** Limits: the Agent Card may be cached for 60 seconds. */
export const CARD_MAX_AGE_SECONDS = 60;

/**
 * The skills of the installed release: one per tool of the pinned Agent version (the agent's
 * capabilities), or, for an agent with no tools, one skill that is the agent itself.
 */
function skillsOf(p: Placement): AgentSkill[] {
  const base = { tags: [] as string[], examples: [] as string[], inputModes: [TEXT_PLAIN], outputModes: [TEXT_PLAIN], securityRequirements: [] };
  const tools = p.agent.tools.map((t): AgentSkill => {
    const description = t.type === 'custom' ? t.description : `The built-in ${t.name} tool`;
    return { ...base, id: `tool:${t.name}`, name: t.name, description, tags: [t.type] };
  });
  if (tools.length > 0) return tools;
  return [{ ...base, id: `agent:${p.agent.name}`, name: p.agent.name, description: p.agent.description ?? `The ${p.agent.name} agent` }];
}

/** The Agent Card of one placement, as wire JSON, and its ETag (a digest of that JSON). */
export function buildCard(p: Placement, publicBaseUrl: string): { json: unknown; etag: string } {
  const url = `${publicBaseUrl.replace(/\/+$/, '')}${endpointPath({ workspaceId: p.workspaceId, installationId: p.installation.id, scopeId: p.scope.id })}`;
  const card: AgentCard = {
    name: p.installation.display_name ?? p.agent.name,
    description: p.agent.description ?? `${p.agent.name}, installed on ${p.scope.display_name}`,
    supportedInterfaces: [{ url, protocolBinding: 'JSONRPC', tenant: '', protocolVersion: A2A_VERSION }],
    provider: undefined,
    version: String(p.agent.version),
    capabilities: { streaming: true, pushNotifications: false, extensions: [], extendedAgentCard: false },
    securitySchemes: {
      principal_credential: { scheme: { $case: 'httpAuthSecurityScheme', value: { description: 'A Principal access credential with audience a2a', scheme: 'Bearer', bearerFormat: '' } } },
    },
    securityRequirements: [{ schemes: { principal_credential: { list: [] } } }],
    defaultInputModes: [TEXT_PLAIN],
    defaultOutputModes: [TEXT_PLAIN],
    skills: skillsOf(p),
    signatures: [],
  };
  const json = AgentCard.toJSON(card);
  return { json, etag: `"${sha256Hex(JSON.stringify(json)).slice(0, 32)}"` };
}

/** The card as the request handler sees it (version checks read its interfaces). */
export function cardFor(p: Placement, publicBaseUrl: string): AgentCard {
  return AgentCard.fromJSON(buildCard(p, publicBaseUrl).json);
}
