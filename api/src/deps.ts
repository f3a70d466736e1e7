import type { Logger, SecretBox, Metrics } from '@agentplane/core';
import type { DocumentStore, EventHub, ReadCache, Redis } from '@agentplane/store';
import type { Agent } from '@agentplane/domain';
import type { VersionedStore } from '@agentplane/domain';
import type { Environment } from '@agentplane/domain';
import type { SessionService } from './sessions/service.js';
import type { ThreadRuntime, TurnScheduler } from '@agentplane/domain';
import type { ApiConfig } from './config.js';
import type { CredentialIndex } from '@agentplane/domain';
import type { IdempotencyStore } from './http/idempotency.js';
import type { IdentityService } from '@agentplane/domain';
import type { RunnerService } from '@agentplane/domain';
import type { PresenceStore } from '@agentplane/gateway';
import type { ModelsModule } from './models/module.js';
import type { RunsModule } from './runs/module.js';
import type { FileStore } from '@agentplane/domain';
import type { MemoryService } from './memory/service.js';
import type { VaultService } from './vaults/service.js';
import type { ProjectService } from './projects/service.js';
import type { AuditLog } from './audit/store.js';
import type { PermissionStore } from './governance/permissions.js';
import type { PolicyStore } from './governance/policies.js';
import type { ApprovalService } from './approvals/service.js';
import type { AutomationService } from './automations/service.js';
import type { WebhookDispatcher } from './webhooks/delivery.js';
import type { SessionEventTap } from './events/tap.js';
import type { SkillService } from './skills/service.js';
import type { SkillSourceService } from './skill-sources/service.js';
import type { ToolSourceService } from './tool-sources/service.js';
import type { ToolSourceMigrations } from './tool-sources/migrations.js';
import type { A2aToolCalls } from './tool-sources/calls.js';
import type { SkillProposalService } from './skill-proposals/service.js';
import type { SurfaceScopeStore } from './surface-scopes/store.js';
import type { AgentInstallationStore } from './installations/store.js';

/** Everything an operation handler may use. Built once per process in app.ts. */
export interface ApiDeps {
  config: ApiConfig;
  redis: Redis;
  /** The process's cache of hot keys, invalidated by Redis (CLIENT TRACKING); see `ReadCache`. */
  reads: ReadCache;
  docs: DocumentStore;
  credentials: CredentialIndex;
  idempotency: IdempotencyStore;
  identity: IdentityService;
  runners: RunnerService;
  /** Runner presence projection (read side; the gateway writes it). */
  gatewayPresence: PresenceStore;
  /** Model credentials, routing profiles, the model gateway service, usage and budgets. */
  models: ModelsModule;
  /** Runs: the BullMQ queues, lease keeper and life cycle (the API side of scheduling). */
  runs: RunsModule;
  /** The per-Workspace append-only audit log (written by the pipeline and the governance checks). */
  audit: AuditLog;
  /** PermissionAssignments (checked live by the pipeline for Principal credentials). */
  permissions: PermissionStore;
  /** ActionPolicies and their live evaluation (tool calls, MCP tools/call, session drive). */
  policies: PolicyStore;
  /** ActionApprovals: require_approval decisions at the tool-call boundary and their resolution. */
  approvals: ApprovalService;
  /** Automations: firings, schedules (BullMQ Job Schedulers) and the firing worker. */
  automations: AutomationService;
  /** Outbound webhook endpoints: the event tap, delivery lanes and the delivery log. */
  webhooks: WebhookDispatcher;
  /** One pattern subscription to every Session's live channel (webhook lanes, subscription triggers). */
  eventTap: SessionEventTap;
  /** SurfaceScopes (root → team → channel, personal) and the external installations they live under. */
  surfaceScopes: SurfaceScopeStore;
  /** AgentInstallations: a pinned Agent version installed on SurfaceScopes (served over A2A). */
  installations: AgentInstallationStore;
  secretBox: SecretBox;
  metrics: Metrics;
  log: Logger;
  agents: VersionedStore<Agent>;
  environments: VersionedStore<Environment>;
  sessions: SessionService;
  /** Uploaded Files (heads in the workspace, content chunked under each File's own tag). */
  files: FileStore;
  /** MemoryStores: documents, versions and their full-text search (docs/MEMORY.md). */
  memory: MemoryService;
  /** Vaults: sealed per-Session secrets for MCP servers and git (resolved in `vault_ids` order). */
  vaults: VaultService;
  /** Uploaded Projects: immutable revisions of file trees, mounted as `uploaded_project` resources. */
  projects: ProjectService;
  /** Skills: versioned Agent Skill directories (docs/SKILLS.md). */
  skills: SkillService;
  /** Git repositories skills are submitted to and adopted from. */
  skillSources: SkillSourceService;
  /** Reviewed provider packages and external A2A agents as tool sources (docs/A2A_TOOLS.md). */
  toolSources: ToolSourceService;
  toolSourceMigrations: ToolSourceMigrations;
  /** Consumed external A2A tool calls: one `exec.tool_invocation` each, and the due sweep. */
  a2aCalls: A2aToolCalls;
  /** Skill proposals: authoring, verification, submission and adoption jobs. */
  skillProposals: SkillProposalService;
  /** The SessionThread state machine (drive events here; the runtime side reports turn boundaries). */
  threadRuntime: ThreadRuntime;
  /** Where started turns go; replace `turns.scheduler` to plug a scheduler in. */
  turns: { scheduler: TurnScheduler };
  /** The process's one fan-out of live session events (one subscriber connection). */
  eventHub: EventHub;
  /** Fires when shutdown begins: long-lived streams end on it. */
  shutdownSignal: AbortSignal;
}
