import { describe, expect, it } from 'vitest';
import { Id, Obj, Type } from '@agentplane/core';
import { ADMINS, READERS, type Caller } from '../http/caller.js';
import { defineOperation, json, type Operation } from '../http/operation.js';
import { ToolCatalog, SEARCH_TOOL, toolName } from './catalog.js';
import { classify } from './edge.js';
import { McpProtocolError } from './protocol.js';

const handler = async () => json(200, {});
const op = (o: Partial<Operation> & Pick<Operation, 'operationId' | 'method' | 'path'>): Operation =>
  defineOperation({ summary: o.operationId, auth: { kind: 'bearer', roles: READERS }, handler, ...o } as Operation);

const table: Operation[] = [
  op({ operationId: 'sessions.createSession', method: 'POST', path: '/v1/sessions', auth: { kind: 'bearer', roles: ADMINS },
    body: Obj({ title: Type.String() }), idempotency: 'optional' }),
  op({ operationId: 'sessions.getSession', method: 'GET', path: '/v1/sessions/{session_id}', params: Obj({ session_id: Id('session') }) }),
  op({ operationId: 'sessions.streamEventsStream', method: 'GET', path: '/v1/sessions/{session_id}/events/stream' }),
  op({ operationId: 'sessions.archiveSession', method: 'POST', path: '/v1/sessions/{session_id}/archive', mcp: 'full' }),
  op({ operationId: 'agents.getAgent', method: 'GET', path: '/v1/agents/{agent_id}', auth: { kind: 'bearer', roles: READERS, principal: true }, mcpPrincipal: true }),
  op({ operationId: 'agents.listAgents', method: 'GET', path: '/v1/agents', auth: { kind: 'bearer', roles: READERS, principal: true } }),
  op({ operationId: 'principals.updateThing', method: 'PATCH', path: '/v1/things/{id}', auth: { kind: 'bearer', roles: ADMINS, principal: true } }),
  op({ operationId: 'widgets.deleteWidget', method: 'DELETE', path: '/v1/widgets/{id}' }),
  op({ operationId: 'support.ping', method: 'GET', path: '/v1/ping', mcp: 'compact' }),
  op({ operationId: 'keys.rotate', method: 'POST', path: '/v1/keys/rotate', sensitive: true, idempotency: 'required' }),
  op({ operationId: 'runners.redeemPairing', method: 'POST', path: '/v1/runner-pairings/redeem' }),
  op({ operationId: 'models.createModelCredential', method: 'POST', path: '/v1/model-credentials' }),
  op({ operationId: 'models.getModelCredential', method: 'GET', path: '/v1/model-credentials/{id}', mcp: 'full' }),
  op({ operationId: 'files.upload', method: 'POST', path: '/v1/files' }),
  op({ operationId: 'skills.importSkill', method: 'POST', path: '/v1/skills/import' }),
  op({ operationId: 'audit.exportAudit', method: 'POST', path: '/v1/audit/export', mcp: 'full' }),
  op({ operationId: 'hidden.thing', method: 'GET', path: '/v1/hidden', mcp: 'never' }),
  op({ operationId: 'meta.open', method: 'GET', path: '/v1/open', auth: { kind: 'none' } }),
];

const caller = (over: Partial<Caller>): Caller => ({
  kind: 'api_key', credentialId: 'key_x', organizationId: 'org_x', workspaceId: 'wrkspc_x', scope: 'workspace',
  role: 'admin', principalId: null, audience: null, rateLimitPerMinute: null, ...over,
});

describe('ToolCatalog', () => {
  const catalog = new ToolCatalog(table);

  it('projects only what may be exposed', () => {
    expect([...catalog.tools.keys()].sort()).toEqual([
      'agents_getAgent', 'agents_listAgents', 'audit_exportAudit', 'models_getModelCredential', 'principals_updateThing', 'sessions_archiveSession', 'sessions_createSession', 'sessions_getSession', 'support_ping', 'widgets_deleteWidget',
    ]);
  });

  it('compact = compact-marked operations plus unmarked operations of the journey groups, plus search', () => {
    const names = catalog.list(caller({}), 'compact').map((t) => t.name).sort();
    expect(names).toEqual([SEARCH_TOOL, 'agents_getAgent', 'agents_listAgents', 'sessions_createSession', 'sessions_getSession', 'support_ping']);
    expect(catalog.list(caller({}), 'full').map((t) => t.name)).toContain('widgets_deleteWidget');
  });

  it('builds {path, query, body, idempotency_key} and requires the key for keyed mutations', () => {
    const create = catalog.tools.get('sessions_createSession');
    expect(create?.requiresKey).toBe(true);
    expect(create?.tool.inputSchema.required).toEqual(['body', 'idempotency_key']);
    const get = catalog.tools.get('sessions_getSession');
    expect(get?.requiresKey).toBe(false);
    expect(get?.tool.inputSchema.required).toEqual(['path']);
    expect(get?.tool.annotations.readOnlyHint).toBe(true);
    expect(catalog.tools.get('widgets_deleteWidget')?.tool.annotations.destructiveHint).toBe(true);
  });

  it('filters by role, and gives Principal credentials the read-only principal catalog', () => {
    const viewer = catalog.list(caller({ role: 'viewer' }), 'full').map((t) => t.name);
    expect(viewer).not.toContain('sessions_createSession');
    const principal = catalog.list(caller({ kind: 'principal_credential', role: null, audience: 'api_mcp' }), 'compact').map((t) => t.name);
    // Only reads marked mcpPrincipal: a REST read that admits Principals is not enough.
    expect(principal).toEqual(['agents_getAgent']);
  });

  it('refuses mcpPrincipal on anything but a Principal-admitting GET', () => {
    expect(() => new ToolCatalog([op({ operationId: 'x.y', method: 'POST', path: '/v1/x', auth: { kind: 'bearer', roles: READERS, principal: true }, mcpPrincipal: true })])).toThrow(/mcpPrincipal/);
    expect(() => new ToolCatalog([op({ operationId: 'x.y', method: 'GET', path: '/v1/x', mcpPrincipal: true })])).toThrow(/mcpPrincipal/);
  });

  it('search ranks by words, tolerates plurals and finds unlisted operations', () => {
    expect(catalog.search(caller({}), 'delete widgets', 10).map((p) => p.tool.name)).toEqual(['widgets_deleteWidget']);
    expect(catalog.search(caller({}), 'session', 10).map((p) => p.tool.name)).toContain('sessions_archiveSession');
    expect(catalog.search(caller({}), 'nothing-like-this', 10)).toEqual([]);
  });

  it('flattens every dot of the operationId', () => {
    expect(toolName('a.b.c')).toBe('a_b_c');
  });
});

describe('classify', () => {
  const meta = (v: string) => ({ 'io.modelcontextprotocol/protocolVersion': v, 'io.modelcontextprotocol/clientCapabilities': {} });
  const code = (fn: () => unknown): number | undefined => {
    try {
      fn();
      return undefined;
    } catch (err) {
      return (err as McpProtocolError).code;
    }
  };

  it('legacy: initialize needs no header; later requests need a served one; notifications may omit it', () => {
    expect(classify({ jsonrpc: '2.0', id: 1, method: 'initialize', params: {} }, {})).toEqual({ kind: 'legacy', version: null });
    expect(code(() => classify({ jsonrpc: '2.0', id: 1, method: 'tools/list' }, {}))).toBe(-32600);
    expect(code(() => classify({ jsonrpc: '2.0', id: 1, method: 'tools/list' }, { 'mcp-protocol-version': '2024-11-05' }))).toBe(-32600);
    expect(classify({ jsonrpc: '2.0', method: 'notifications/initialized' }, {})).toEqual({ kind: 'legacy', version: null });
  });

  it('modern: every header must agree with the body', () => {
    const h = { 'mcp-protocol-version': '2026-07-28', 'mcp-method': 'tools/call', 'mcp-name': 'x_y' };
    const msg = { jsonrpc: '2.0' as const, id: 1, method: 'tools/call', params: { name: 'x_y', _meta: meta('2026-07-28') } };
    expect(classify(msg, h)).toEqual({ kind: 'modern' });
    expect(code(() => classify(msg, { ...h, 'mcp-name': 'x_z' }))).toBe(-32020);
    expect(code(() => classify(msg, { ...h, 'mcp-method': 'tools/list' }))).toBe(-32020);
    expect(code(() => classify(msg, { ...h, 'mcp-protocol-version': '2025-11-25' }))).toBe(-32020);
    expect(code(() => classify({ ...msg, params: { name: 'x_y', _meta: meta('2099-01-01') } }, { ...h, 'mcp-protocol-version': '2099-01-01' }))).toBe(-32022);
    expect(code(() => classify({ ...msg, params: { name: 'x_y', _meta: { 'io.modelcontextprotocol/protocolVersion': '2026-07-28' } } }, h))).toBe(-32602);
  });
});
