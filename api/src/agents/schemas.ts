import { Id, LogicalKey, Metadata, Nullable, Obj, Timestamp, Type, type Static } from '@agentplane/core';

export const Permission = Type.Union([Type.Literal('always_allow'), Type.Literal('always_ask')]);
export const BUILTIN_TOOLS = ['bash', 'read', 'write', 'edit', 'glob', 'grep', 'web_fetch', 'web_search', 'ask_user'] as const;
const ToolName = Type.String({ pattern: '^[a-zA-Z0-9_-]{1,64}$' });

/** A JSON Schema object (validated as an object; its content is the tool author's). */
const JsonSchemaObject = Type.Unsafe<Record<string, unknown>>({ type: 'object' });

export const BuiltinTool = Obj({
  type: Type.Literal('builtin'),
  name: Type.Union(BUILTIN_TOOLS.map((n) => Type.Literal(n))),
  permission: Type.Optional(Permission),
});
export const CustomTool = Obj({
  type: Type.Literal('custom'),
  name: ToolName,
  description: Type.String({ maxLength: 4096 }),
  input_schema: JsonSchemaObject,
  permission: Type.Optional(Permission),
});
export const Tool = Type.Union([BuiltinTool, CustomTool]);
export const Tools = Type.Array(Tool, { maxItems: 128 });

export const McpServer = Obj({
  name: ToolName,
  type: Type.Literal('url'),
  url: Type.String({ format: 'uri', pattern: '^https?://', maxLength: 2048 }),
  permission: Type.Optional(Permission),
});
export const McpServers = Type.Array(McpServer, { maxItems: 32 });

export type ToolT = Static<typeof Tool>;
export type McpServerT = Static<typeof McpServer>;

/** The configurable part of an Agent; also the inline `agent` of a Session create. */
export const AgentConfigFields = {
  name: Type.String({ minLength: 1, maxLength: 200 }),
  description: Type.Optional(Nullable(Type.String({ maxLength: 2048 }))),
  model: LogicalKey(),
  system: Type.Optional(Nullable(Type.String({ maxLength: 200_000 }))),
  tools: Type.Optional(Tools),
  mcp_servers: Type.Optional(McpServers),
  metadata: Type.Optional(Metadata()),
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
    metadata: Type.Optional(Metadata()),
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
  metadata: Metadata(),
  version: Type.Integer({ minimum: 1 }),
  archived_at: Nullable(Timestamp()),
  created_at: Timestamp(),
  updated_at: Timestamp(),
});

export const AgentPath = Obj({ agent_id: Id('agent') });
export const AgentVersionPath = Obj({ agent_id: Id('agent'), version: Type.Integer({ minimum: 1 }) });
