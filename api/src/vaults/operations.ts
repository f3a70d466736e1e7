import { Id, Nullable, Obj, Page, PageQuery, Type } from '@agentplane/core';
import { ADMINS, READERS } from '../http/caller.js';
import { createOnce } from '../http/keyed-create.js';
import type { Operation } from '../http/operation.js';
import { pageOf, workspaceRead, workspaceWrite } from '../http/workspace-operation.js';
import { publicVault, SecretInput, SecretName, VaultSchema } from './model.js';

const VaultPath = Obj({ vault_id: Id('vault') });
const SecretPath = Obj({ vault_id: Id('vault'), secret_name: SecretName() });
const readers = { kind: 'bearer', roles: READERS } as const;
const admins = { kind: 'bearer', roles: ADMINS } as const;

/**
 * Vaults (`vlt_`): named secrets for MCP servers and git over HTTPS, used by Sessions that list
 * the vault in `vault_ids`. Values are accepted on write and never returned (only a 4-character
 * hint); writes are REST-only and need root or admin keys. docs/MEMORY.md, "Vaults".
 */
export const vaultOperations: Operation[] = [
  workspaceWrite('POST', {
    operationId: 'vaults.createVault', path: '/v1/vaults', summary: 'Create a Vault',
    audit: { target: 'response' }, auth: admins, idempotency: 'optional', mcp: 'never', successStatus: 201,
    body: Obj({ name: Type.String({ minLength: 1, maxLength: 200 }), description: Type.Optional(Nullable(Type.String({ maxLength: 2000 }))) }),
    response: VaultSchema,
  }, async (ws, { body, deps, keyed }) => publicVault(await createOnce('vault', keyed, (id) => deps.vaults.find(ws, id), (id) => deps.vaults.create(ws, body, id), 'vault-created'))),
  workspaceRead({
    operationId: 'vaults.listVaults', path: '/v1/vaults', summary: 'List the Vaults of the Workspace (no secret values)',
    auth: readers, query: PageQuery({}), response: Page(VaultSchema), mcp: 'full',
  }, async (ws, { query, deps }) => {
    const page = await deps.vaults.list(ws, pageOf(query));
    return { data: page.data.map(publicVault), next_page: page.next_page };
  }),
  workspaceRead({
    operationId: 'vaults.getVault', path: '/v1/vaults/{vault_id}', summary: 'Read a Vault (secret names, kinds and hints; never values)',
    auth: readers, params: VaultPath, response: VaultSchema, mcp: 'full',
  }, async (ws, { params, deps }) => publicVault(await deps.vaults.get(ws, params.vault_id))),
  workspaceWrite('DELETE', {
    operationId: 'vaults.deleteVault', path: '/v1/vaults/{vault_id}', summary: 'Delete a Vault and its secrets; Sessions naming it skip it',
    audit: { target: 'vault_id' }, auth: admins, params: VaultPath, mcp: 'never',
    response: Obj({ id: Id('vault'), type: Type.Literal('vault_deleted') }),
  }, async (ws, { params, deps }) => {
    await deps.vaults.remove(ws, params.vault_id);
    return { id: params.vault_id, type: 'vault_deleted' };
  }),
  workspaceWrite('PUT', {
    operationId: 'vaults.putSecret', path: '/v1/vaults/{vault_id}/secrets/{secret_name}',
    summary: 'Create or rotate a secret (the value is sealed and never shown again)',
    audit: { target: 'vault_id' }, auth: admins, params: SecretPath, body: SecretInput, response: VaultSchema, mcp: 'never',
  }, async (ws, { params, body, deps }) => publicVault(await deps.vaults.putSecret(ws, params.vault_id, params.secret_name, body))),
  workspaceWrite('DELETE', {
    operationId: 'vaults.deleteSecret', path: '/v1/vaults/{vault_id}/secrets/{secret_name}', summary: 'Delete a secret',
    audit: { target: 'vault_id' }, auth: admins, params: SecretPath, response: VaultSchema, mcp: 'never',
  }, async (ws, { params, deps }) => publicVault(await deps.vaults.deleteSecret(ws, params.vault_id, params.secret_name))),
];
