/** The tool and MCP server entries an Agent (and the snapshot each Run carries) declares. */
import { Id, Obj, Type, type Static } from '@agentplane/core';

export const Permission = Type.Union([Type.Literal('always_allow'), Type.Literal('always_ask')]);
/** The built-in tools a runner offers (runner-daemon/src/harness/tools/), and `ask_user`. */
export const BUILTIN_TOOLS = [
  'bash', 'read', 'write', 'edit', 'list', 'glob', 'grep', 'ask_user',
  // Browser observation (an Environment with `browser: true`; docs/SANDBOX.md).
  'browser_navigate', 'browser_snapshot', 'browser_click', 'browser_type', 'browser_press_key', 'browser_wait_for', 'browser_screenshot',
] as const;
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

export const UrlMcpServer = Obj({
  name: ToolName,
  type: Type.Literal('url'),
  url: Type.String({ format: 'uri', pattern: '^https?://', maxLength: 2048 }),
  permission: Type.Optional(Permission),
});
/** A synced external A2A tool source: each skill is a Tool, always asked before each call (docs/A2A_TOOLS.md). */
export const A2aToolSourceServer = Obj({
  name: ToolName,
  type: Type.Literal('a2a_tool_source'),
  tool_source_id: Id('toolSource'),
  permission: Type.Optional(Type.Literal('always_ask')),
});
export const McpServer = Type.Union([UrlMcpServer, A2aToolSourceServer]);
export const McpServers = Type.Array(McpServer, { maxItems: 32 });

export type ToolT = Static<typeof Tool>;
export type McpServerT = Static<typeof McpServer>;

