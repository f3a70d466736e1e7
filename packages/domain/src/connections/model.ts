/**
 * A Connection: one configured external MCP server of a Workspace (Streamable HTTP URL and,
 * optionally, a bearer secret sealed at rest). Agent versions attach Connections with a tool
 * permission policy; a Run reaches them through `/v1/runtime/mcp/{connection_id}`.
 */
export interface Connection {
  id: string;
  type: 'connection';
  workspace_id: string;
  name: string;
  kind: 'mcp_server';
  transport: 'streamable_http';
  url: string;
  /** `secret` is sealed (AES-256-GCM, associated data = the connection id); never returned. */
  auth: { type: 'none' } | { type: 'bearer'; sealed_secret: string; secret_hint: string };
  status: 'active' | 'archived';
  archived_at: string | null;
  version: number;
  created_at: string;
  updated_at: string;
}
