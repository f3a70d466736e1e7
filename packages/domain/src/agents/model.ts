import { ApiError, newId, nowIso } from '@agentplane/core';
import type { McpServerT, ToolT } from './tools.js';
import type { VersionedDoc } from '../versioned.js';
import { SKILL_TOOL_NAME, type SkillSelection } from '../skills/model.js';
import type { MultiagentT } from './multiagent.js';

export interface Agent extends VersionedDoc {
  type: 'agent';
  workspace_id: string;
  name: string;
  description: string | null;
  /** Model routing profile key (logical key). */
  model: string;
  system: string | null;
  tools: ToolT[];
  mcp_servers: McpServerT[];
  /** Skills a Run of this Agent places in its sandbox (name + version; docs/SKILLS.md). Absent on older documents. */
  skills?: SkillSelection[];
  metadata: Record<string, string>;
  /** A coordinator's roster (docs/COORDINATION.md); absent on other Agents. */
  multiagent?: MultiagentT;
}

/** The resolved Agent Version a Session (and each Run) carries. */
export interface AgentSnapshot {
  id: string;
  type: 'agent';
  name: string;
  version: number;
  model: string;
  system: string | null;
  tools: ToolT[];
  mcp_servers: McpServerT[];
  skills?: SkillSelection[];
  /** A coordinator's roster; a child thread's snapshot never has it. */
  multiagent?: MultiagentT;
}

export interface AgentConfigInput {
  name: string;
  description?: string | null | undefined;
  model: string;
  system?: string | null | undefined;
  tools?: ToolT[] | undefined;
  mcp_servers?: McpServerT[] | undefined;
  skills?: SkillSelection[] | undefined;
  metadata?: Record<string, string> | undefined;
  multiagent?: MultiagentT | null | undefined;
}

/**
 * Defaults: built-in tools always_allow, custom tools always_allow (the caller answers them), MCP tools always_ask.
 * Each name once (400 otherwise): the model is offered the tools by name, and a model provider
 * refuses a request naming one tool twice, so a version declaring that could never run. For the
 * same reason no custom tool is named `skill`: that is the built-in tool a Run offers beside
 * them to open its skills (docs/SKILLS.md), whether the Agent selects skills now or a later
 * version or deployment revision does.
 */
export function normaliseTools(tools: ToolT[]): ToolT[] {
  const seen = new Map<string, number>();
  tools.forEach((t, i) => {
    if (t.type === 'custom' && t.name === SKILL_TOOL_NAME) {
      throw new ApiError('validation.malformed', `tools[${i}].name: '${SKILL_TOOL_NAME}' is the built-in tool skills are opened with; name the custom tool otherwise`);
    }
    const first = seen.get(t.name);
    if (first !== undefined) throw new ApiError('validation.malformed', `tools[${i}].name: '${t.name}' is the name of tools[${first}] too; each tool name once`);
    seen.set(t.name, i);
  });
  return tools.map((t) => ({ ...t, permission: t.permission ?? 'always_allow' }));
}
export function normaliseMcp(servers: McpServerT[]): McpServerT[] {
  return servers.map((s): McpServerT => (s.type === 'a2a_tool_source' ? { ...s, permission: 'always_ask' } : { ...s, permission: s.permission ?? 'always_ask' }));
}

export function newAgent(workspaceId: string, input: AgentConfigInput): Agent {
  const now = nowIso();
  return {
    id: newId('agent'), type: 'agent', workspace_id: workspaceId, name: input.name, description: input.description ?? null,
    model: input.model, system: input.system ?? null, tools: normaliseTools(input.tools ?? []),
    mcp_servers: normaliseMcp(input.mcp_servers ?? []), ...(input.skills && input.skills.length > 0 ? { skills: input.skills } : {}), metadata: input.metadata ?? {}, version: 1, archived_at: null,
    created_at: now, updated_at: now,
    ...(input.multiagent ? { multiagent: input.multiagent } : {}),
  };
}

export function snapshotOf(a: Agent): AgentSnapshot {
  return {
    id: a.id, type: 'agent', name: a.name, version: a.version, model: a.model, system: a.system, tools: a.tools, mcp_servers: a.mcp_servers,
    ...(a.skills && a.skills.length > 0 ? { skills: a.skills } : {}),
    ...(a.multiagent ? { multiagent: a.multiagent } : {}),
  };
}
