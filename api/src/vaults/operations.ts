import { Id, Nullable, Obj, Page, PageQuery, Type } from '@agentplane/core';
import { ADMINS, READERS } from '../http/caller.js';
import { defineOperation, json, type Operation } from '../http/operation.js';
import { requireWorkspace } from '../http/workspace-scope.js';
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
  defineOperation({
    operationId: 'vaults.createVault', method: 'POST', path: '/v1/vaults', summary: 'Create a Vault',
    audit: { target: 'response' }, auth: admins, idempotency: 'optional', mcp: 'never', successStatus: 201,
    body: Obj({ name: Type.String({ minLength: 1, maxLength: 200 }), description: Type.Optional(Nullable(Type.String({ maxLength: 2000 }))) }),
    response: VaultSchema,
    async handler({ caller, body, deps }) {
      return json(201, publicVault(await deps.vaults.create(requireWorkspace(caller), body)));
    },
  }),
  defineOperation({
    operationId: 'vaults.listVaults', method: 'GET', path: '/v1/vaults', summary: 'List the Vaults of the Workspace (no secret values)',
    auth: readers, query: PageQuery({}), response: Page(VaultSchema), mcp: 'full',
    async handler({ caller, query, deps }) {
      const page = await deps.vaults.list(requireWorkspace(caller), { limit: query.limit ?? 20, page: query.page });
      return json(200, { data: page.data.map(publicVault), next_page: page.next_page });
    },
  }),
  defineOperation({
    operationId: 'vaults.getVault', method: 'GET', path: '/v1/vaults/{vault_id}', summary: 'Read a Vault (secret names, kinds and hints; never values)',
    auth: readers, params: VaultPath, response: VaultSchema, mcp: 'full',
    async handler({ caller, params, deps }) {
      return json(200, publicVault(await deps.vaults.get(requireWorkspace(caller), params.vault_id)));
    },
  }),
  defineOperation({
    operationId: 'vaults.deleteVault', method: 'DELETE', path: '/v1/vaults/{vault_id}', summary: 'Delete a Vault and its secrets; Sessions naming it skip it',
    audit: { target: 'vault_id' }, auth: admins, params: VaultPath, mcp: 'never',
    response: Obj({ id: Id('vault'), type: Type.Literal('vault_deleted') }),
    async handler({ caller, params, deps }) {
      await deps.vaults.remove(requireWorkspace(caller), params.vault_id);
      return json(200, { id: params.vault_id, type: 'vault_deleted' });
    },
  }),
  defineOperation({
    operationId: 'vaults.putSecret', method: 'PUT', path: '/v1/vaults/{vault_id}/secrets/{secret_name}',
    summary: 'Create or rotate a secret (the value is sealed and never shown again)',
    audit: { target: 'vault_id' }, auth: admins, params: SecretPath, body: SecretInput, response: VaultSchema, mcp: 'never',
    async handler({ caller, params, body, deps }) {
      return json(200, publicVault(await deps.vaults.putSecret(requireWorkspace(caller), params.vault_id, params.secret_name, body)));
    },
  }),
  defineOperation({
    operationId: 'vaults.deleteSecret', method: 'DELETE', path: '/v1/vaults/{vault_id}/secrets/{secret_name}', summary: 'Delete a secret',
    audit: { target: 'vault_id' }, auth: admins, params: SecretPath, response: VaultSchema, mcp: 'never',
    async handler({ caller, params, deps }) {
      return json(200, publicVault(await deps.vaults.deleteSecret(requireWorkspace(caller), params.vault_id, params.secret_name)));
    },
  }),
];
