import { ApiError, newId, type SecretBox } from '@agentplane/core';
import { tags, type DocumentStore } from '@agentplane/store';
import type { Connection } from './model.js';
import type { ConnectionGrant } from './runtime-bearer.js';

/** One entry of an agent version's `mcp_servers`. */
export type AgentMcpServer =
  | { name: string; type?: 'url'; url: string; permission?: 'always_allow' | 'always_ask' | undefined }
  | { name: string; type: 'a2a_tool_source'; tool_source_id: string; permission?: 'always_ask' | undefined };

/** What the lease work puts in a runtime grant (and tells the harness) for one agent version. */
export interface ResolvedMcpServers {
  /** For `RuntimeGrant.connections`. */
  grants: Record<string, ConnectionGrant>;
  /** For the harness: the agent's server name → the runtime endpoint's connection id. */
  servers: { name: string; connection_id: string }[];
  /** Names of servers no active Connection of the workspace serves (the Run gets no tools from them). */
  unresolved: string[];
}

/** An MCP server URL as Connections are matched by: no fragment, no trailing slash. */
export const normalizeUrl = (url: string): string => {
  try {
    const u = new URL(url);
    u.hash = '';
    return u.toString().replace(/\/$/, '');
  } catch {
    return url;
  }
};

export type ConnectionAuthInput = { type: 'none' } | { type: 'bearer'; token: string };

const nowIso = () => new Date().toISOString();
const hint = (token: string) => (token.length <= 8 ? '…' : `…${token.slice(-4)}`);

/** Workspace-owned Connection documents; the upstream secret is sealed with the service's SecretBox. */
export class ConnectionService {
  constructor(
    private readonly docs: DocumentStore,
    private readonly box: SecretBox,
  ) {}

  private seal(id: string, auth: ConnectionAuthInput): Connection['auth'] {
    if (auth.type === 'none') return { type: 'none' };
    return { type: 'bearer', sealed_secret: this.box.seal(auth.token, `connection:${id}`), secret_hint: hint(auth.token) };
  }

  /** A Connection URL is an address, never a credential holder: userinfo belongs in `auth`. */
  private static checkUrl(url: string): void {
    let u: URL;
    try {
      u = new URL(url);
    } catch {
      throw new ApiError('validation.malformed', 'body.url: not a valid URL');
    }
    if (u.protocol !== 'https:' && u.protocol !== 'http:') throw new ApiError('validation.malformed', 'body.url: must be http or https');
    if (u.username || u.password) throw new ApiError('validation.malformed', 'body.url: must not carry credentials; put the token in auth');
  }

  async create(workspaceId: string, input: { name: string; url: string; auth?: ConnectionAuthInput | undefined }, id = newId('connection')): Promise<Connection> {
    ConnectionService.checkUrl(input.url);
    const now = nowIso();
    const c: Connection = {
      id, type: 'connection', workspace_id: workspaceId, name: input.name, kind: 'mcp_server', transport: 'streamable_http',
      url: input.url, auth: this.seal(id, input.auth ?? { type: 'none' }), status: 'active', archived_at: null,
      version: 1, created_at: now, updated_at: now,
    };
    await this.docs.create(tags.workspace(workspaceId), c, ['connections']);
    return c;
  }

  /** The Connection stored under `id` in the Workspace, of any kind; null when there is none. */
  find(workspaceId: string, id: string): Promise<Connection | null> {
    return this.docs.get<Connection>(tags.workspace(workspaceId), id);
  }

  async get(workspaceId: string, id: string): Promise<Connection> {
    const c = await this.find(workspaceId, id);
    if (!c || c.workspace_id !== workspaceId) throw new ApiError('validation.not_found', 'connection not found');
    // Connections of kind a2a_tool_source are read through their tool source (docs/A2A_TOOLS.md).
    if (c.kind !== 'mcp_server') throw new ApiError('validation.not_found', `connection ${id} is not an MCP server Connection; read it at /v1/tool-sources/{tool_source_id}/connections`);
    return c;
  }

  async update(
    workspaceId: string,
    id: string,
    patch: { name?: string | undefined; url?: string | undefined; auth?: ConnectionAuthInput | undefined; status?: 'active' | 'archived' | undefined },
    expectedVersion?: number,
  ): Promise<Connection> {
    if (patch.url !== undefined) ConnectionService.checkUrl(patch.url);
    await this.get(workspaceId, id);
    return this.docs.update<Connection>(tags.workspace(workspaceId), id, (c) => {
      // The stored token was written for the server at the Connection's origin: re-pointed to
      // another origin, the token is written again (or removed) in the same request, never sent
      // on to a server it was not written for.
      if (patch.url !== undefined && patch.auth === undefined && c.auth.type === 'bearer' && new URL(patch.url).origin !== new URL(c.url).origin) {
        throw new ApiError('validation.malformed', `body.auth: the Connection holds an upstream token for ${new URL(c.url).origin}; re-pointing it to ${new URL(patch.url).origin} takes its auth in the same request (the token for that server, or {"type": "none"})`);
      }
      return {
        ...c,
        ...(patch.name !== undefined ? { name: patch.name } : {}),
        ...(patch.url !== undefined ? { url: patch.url } : {}),
        ...(patch.auth !== undefined ? { auth: this.seal(id, patch.auth) } : {}),
        ...(patch.status !== undefined ? { status: patch.status, archived_at: patch.status === 'archived' ? (c.archived_at ?? nowIso()) : null } : {}),
      };
    }, { expectedVersion, notFound: 'connection', unchangedKeepsVersion: true });
  }

  /**
   * Resolve an agent version's `mcp_servers` to the workspace's active Connections, matched by
   * URL (the Connection holds the credential the agent definition never carries).
   * `always_ask` becomes `ask` for every tool of that server, anything else `allow`.
   */
  async resolveAgentServers(workspaceId: string, servers: readonly AgentMcpServer[]): Promise<ResolvedMcpServers> {
    const byUrl = new Map<string, Connection>();
    let page: string | undefined;
    do {
      const r = await this.docs.list<Connection>(tags.workspace(workspaceId), 'connections', { limit: 100, page, order: 'asc' }, (c) => c.status === 'active');
      for (const c of r.data) if (!byUrl.has(normalizeUrl(c.url))) byUrl.set(normalizeUrl(c.url), c);
      page = r.next_page ?? undefined;
    } while (page);
    const out: ResolvedMcpServers = { grants: {}, servers: [], unresolved: [] };
    for (const s of servers) {
      if (s.type === 'a2a_tool_source') continue;
      const c = byUrl.get(normalizeUrl(s.url));
      if (!c) {
        out.unresolved.push(s.name);
        continue;
      }
      out.grants[c.id] = { default: s.permission === 'always_ask' ? 'ask' : 'allow' };
      out.servers.push({ name: s.name, connection_id: c.id });
    }
    return out;
  }

  /** The upstream bearer, unsealed for one outbound request; never logged, never returned. */
  upstreamToken(c: Connection): string | null {
    return c.auth.type === 'bearer' ? this.box.open(c.auth.sealed_secret, `connection:${c.id}`) : null;
  }
}
