import type { Operation } from './http/operation.js';
import { connectionOperations } from './connections/operations.js';
import { identityOperations } from './identity/operations.js';
import { metaOperations } from './meta/operations.js';
import { modelOperations } from './models/operations.js';
import { agentOperations } from './agents/operations.js';
import { environmentOperations } from './environments/operations.js';
import { sessionOperations } from './sessions/operations.js';
import { threadOperations } from './sessions/thread-operations.js';
import { runnerOperations } from './runners/operations.js';
import { runOperations } from './runs/operations.js';
import { fileOperations } from './files/operations.js';
import { memoryOperations } from './memory/operations.js';
import { vaultOperations } from './vaults/operations.js';
import { projectOperations } from './projects/operations.js';
import { auditOperations } from './audit/operations.js';
import { governanceOperations } from './governance/operations.js';
import { policyOperations } from './governance/policy-operations.js';
import { approvalOperations } from './approvals/operations.js';
import { automationOperations } from './automations/operations.js';
import { webhookOperations } from './webhooks/operations.js';
import { deploymentOperations } from './deployments/operations.js';
import { skillOperations } from './skills/operations.js';
import { skillSourceOperations } from './skill-sources/operations.js';
import { skillProposalOperations } from './skill-proposals/operations.js';
import { surfaceScopeOperations } from './surface-scopes/operations.js';
import { installationOperations } from './installations/operations.js';
import { toolSourceOperations } from './tool-sources/operations.js';
import { a2aCallbackOperations } from './tool-sources/callbacks.js';

/**
 * The operation table: every REST operation of the API, once. The router, the OpenAPI
 * document, the capability report and the MCP tool projection are all generated from it.
 * Each domain module contributes its own list here.
 */
export function allOperations(): Operation[] {
  const table: Operation[] = [];
  table.push(...metaOperations(() => table), ...identityOperations, ...runnerOperations, ...modelOperations);
  table.push(...agentOperations, ...environmentOperations, ...sessionOperations, ...threadOperations);
  table.push(...connectionOperations, ...runOperations, ...fileOperations, ...memoryOperations, ...vaultOperations, ...projectOperations, ...auditOperations, ...governanceOperations, ...policyOperations, ...approvalOperations);
  table.push(...automationOperations, ...webhookOperations);
  table.push(...deploymentOperations);
  table.push(...skillOperations, ...skillSourceOperations, ...skillProposalOperations);
  table.push(...surfaceScopeOperations, ...installationOperations);
  table.push(...toolSourceOperations, ...a2aCallbackOperations);
  return table;
}
