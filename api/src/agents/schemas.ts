import { Id, LogicalKey, Metadata, Nullable, Obj, Timestamp, Type } from '@agentplane/core';
import { Tools, McpServers, Multiagent } from '@agentplane/domain';


/** An Agent's skill selections: Skills of the Workspace by name, each at one version (docs/SKILLS.md). */
export const SkillSelections = Type.Array(Obj({ name: LogicalKey(), version: Type.Integer({ minimum: 1 }) }), { maxItems: 32 });

/** The configurable part of an Agent; also the inline `agent` of a Session create. */
export const AgentConfigFields = {
  name: Type.String({ minLength: 1, maxLength: 200 }),
  description: Type.Optional(Nullable(Type.String({ maxLength: 2048 }))),
  model: LogicalKey(),
  system: Type.Optional(Nullable(Type.String({ maxLength: 200_000 }))),
  tools: Type.Optional(Tools),
  mcp_servers: Type.Optional(McpServers),
  skills: Type.Optional(SkillSelections),
  metadata: Type.Optional(Metadata()),
  /** A coordinator's roster of member Agents, each pinned to a version (docs/COORDINATION.md). */
  multiagent: Type.Optional(Nullable(Multiagent)),
};
export const CreateAgentBody = Obj(AgentConfigFields);

export const UpdateAgentBody = Obj(
  {
    expected_version: Type.Integer({ minimum: 1 }),
    name: Type.Optional(AgentConfigFields.name),
    description: AgentConfigFields.description,
    model: Type.Optional(LogicalKey()),
    system: AgentConfigFields.system,
    tools: Type.Optional(Tools),
    mcp_servers: Type.Optional(McpServers),
    skills: Type.Optional(SkillSelections),
    metadata: Type.Optional(Metadata()),
    multiagent: AgentConfigFields.multiagent,
  },
  { minProperties: 2 },
);

export const AgentSchema = Obj({
  id: Id('agent'),
  type: Type.Literal('agent'),
  workspace_id: Id('workspace'),
  name: Type.String(),
  description: Nullable(Type.String()),
  model: Type.String(),
  system: Nullable(Type.String()),
  tools: Tools,
  mcp_servers: McpServers,
  skills: Type.Optional(SkillSelections),
  metadata: Metadata(),
  multiagent: Type.Optional(Multiagent),
  version: Type.Integer({ minimum: 1 }),
  archived_at: Nullable(Timestamp()),
  created_at: Timestamp(),
  updated_at: Timestamp(),
});

export const AgentPath = Obj({ agent_id: Id('agent') });
export const AgentVersionPath = Obj({ agent_id: Id('agent'), version: Type.Integer({ minimum: 1 }) });
