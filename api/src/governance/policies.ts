import { ApiError, crashPoint, GlobError, newId, nowIso, type Logger, staleOrAhead } from '@agentplane/core';
import {
  cachedGet, DOC_REMOVE_LUA, DOC_SWAP_LUA, docRemoveResult, docSwapResult, keys, LuaScript, tags, type DocumentStore, type Redis, type StoredDoc, type SwapOutcome,
} from '@agentplane/store';
import type { AuditLog } from '../audit/store.js';
import { compileRule, PolicySet, type PolicyDecision, type PolicyEffect, type PolicyRule, type ToolCall, type ToolKind } from './policy-eval.js';

export interface ActionPolicy extends StoredDoc {
  type: 'action_policy';
  workspace_id: string;
  description: string | null;
  effect: PolicyEffect;
  tool: { kind: ToolKind | 'any'; name: string; connection_id: string | null };
  arguments: { command_prefix: string | null; path_glob: string | null };
  principal_id: string | null;
  /** `require_approval` only: how long its ActionApprovals wait before they expire (null: the platform default). */
  approval_expires_in_seconds?: number | null;
}

export type ActionPolicyInput = Pick<ActionPolicy, 'effect' | 'tool' | 'arguments' | 'principal_id' | 'description' | 'approval_expires_in_seconds'>;

export const POLICIES = 'action_policies';

export function toRule(p: ActionPolicy): PolicyRule {
  return {
    id: p.id, effect: p.effect, tool_kind: p.tool.kind, tool_name: p.tool.name, connection_id: p.tool.connection_id,
    command_prefix: p.arguments.command_prefix, path_glob: p.arguments.path_glob, principal_id: p.principal_id, created_at: p.created_at,
  };
}

/** A rule whose pattern does not compile is refused with 400 before anything is written. */
export function checkPatterns(input: ActionPolicyInput): void {
  try {
    compileRule(toRule({ ...input, id: 'apol_check', type: 'action_policy', workspace_id: '', version: 1, created_at: '', updated_at: '' }), 0);
  } catch (err) {
    if (err instanceof GlobError) throw new ApiError('validation.malformed', `body: ${err.message}`);
    throw err;
  }
}

/** Who a governance decision is recorded for. */
export interface DecisionContext {
  actor: { id: string; credential_id: string | null };
  /** What the decision guards, for the audit record (e.g. the Session). */
  target: string | null;
  request_id?: string | null;
  /**
   * Where it is decided, no ActionApproval can be waited for (a request's boundary, an
   * Automation's admission): a `require_approval` refuses the call, and its record says `denied`
   * (the rule's id as detail), not `requested`, since no approval was asked for.
   */
  refusesApproval?: boolean;
  /**
   * How an ActionApproval already settled this very call (the Run's re-check of an approved,
   * denied or expired use): a `require_approval` decision is then recorded as what happened to
   * the call (`allowed` once approved, `denied` otherwise), not as another approval `requested`.
   */
  settledApproval?: 'approved' | 'denied';
}

/** A decision whose audit record waits for its target (`PolicyStore.decideUnrecorded`). */
export interface PendingDecision {
  decision: PolicyDecision;
  /** Writes the decision's audit record naming `target` (once; nothing for a default allow). */
  record(target: string | null): Promise<void>;
}

/** Of several decisions on one call, the strictest stands. */
const STRICTNESS: Record<PolicyDecision['decision'], number> = { allow: 0, require_approval: 1, deny: 2 };

/*
 * Each policy write and the bump of the Workspace's policy-set version (`apol:version`, same slot)
 * are one script, so no write, however its process ends, leaves other processes on a compiled set
 * from before it.
 *
 * Create: KEYS doc, listing, version; ARGV doc JSON, score, id. 1 written, 0 the id exists.
 */
const CREATE = new LuaScript('apol_create', `
if not redis.call('SET', KEYS[1], ARGV[1], 'NX') then return 0 end
redis.call('ZADD', KEYS[2], ARGV[2], ARGV[3])
redis.call('INCR', KEYS[3])
return 1`);

/** Update (compare-and-swap, as `doc_swap`): KEYS doc, version; ARGV expected version, doc JSON. */
const UPDATE = new LuaScript('apol_update', `${DOC_SWAP_LUA}
local r = doc_swap(KEYS[1], ARGV[1], ARGV[2])
if r[1] == 1 then redis.call('INCR', KEYS[2]) end
return r`);

/** Compare-and-delete (as `doc_remove`): KEYS doc, listing, version; ARGV expected version ('' = any), id. */
const REMOVE = new LuaScript('apol_remove', `${DOC_REMOVE_LUA}
local r = doc_remove(KEYS[1], ARGV[1])
if r[1] == 1 then
  redis.call('ZREM', KEYS[2], ARGV[2])
  redis.call('INCR', KEYS[3])
end
return r`);

/**
 * ActionPolicies of each Workspace, plus the compiled set per policy-set version: every write
 * bumps `ap:{w:<ws>}:apol:version` in the script that writes the policy, every decision reads it
 * (through the process's read cache, which Redis invalidates on the bump), so a change governs the
 * very next call; the compiled set is rebuilt only when the version moved.
 */
export class PolicyStore {
  private readonly cache = new Map<string, { version: string; set: PolicySet }>();

  constructor(private readonly redis: Redis, private readonly docs: DocumentStore, private readonly audit: AuditLog, private readonly log: Logger) {}

  private versionKey(ws: string): string {
    return keys.scoped(tags.workspace(ws), 'apol:version');
  }

  private docKey(ws: string, id: string): string {
    return keys.doc(tags.workspace(ws), id);
  }

  private listingKey(ws: string): string {
    return keys.index(tags.workspace(ws), POLICIES);
  }

  async create(ws: string, input: ActionPolicyInput, id = newId('actionPolicy')): Promise<ActionPolicy> {
    checkPatterns(input);
    const now = nowIso();
    const doc: ActionPolicy = { id, type: 'action_policy', workspace_id: ws, ...input, version: 1, created_at: now, updated_at: now };
    const created = await CREATE.run(this.redis, [this.docKey(ws, doc.id), this.listingKey(ws), this.versionKey(ws)], [JSON.stringify(doc), Date.parse(now), doc.id]);
    if (created !== 1) throw new ApiError('validation.conflict', `action policy ${doc.id} already exists`);
    crashPoint('action-policy-created');
    return doc;
  }

  find(ws: string, id: string): Promise<ActionPolicy | null> {
    return this.docs.get<ActionPolicy>(tags.workspace(ws), id);
  }

  async get(ws: string, id: string): Promise<ActionPolicy> {
    const doc = await this.find(ws, id);
    if (!doc || doc.type !== 'action_policy' || doc.workspace_id !== ws) throw new ApiError('validation.not_found', 'action policy not found');
    return doc;
  }

  async update(ws: string, id: string, input: ActionPolicyInput, expectedVersion: number | undefined): Promise<ActionPolicy> {
    checkPatterns(input);
    await this.get(ws, id);
    const write = async (next: ActionPolicy, expected: number): Promise<SwapOutcome> =>
      docSwapResult((await UPDATE.run(this.redis, [this.docKey(ws, id), this.versionKey(ws)], [String(expected), JSON.stringify(next)])) as unknown[]).outcome;
    const next = await this.docs.update<ActionPolicy>(tags.workspace(ws), id, (p) => ({ ...p, ...input }), { expectedVersion, notFound: 'action policy', write });
    crashPoint('action-policy-updated');
    return next;
  }

  /**
   * Deletes the rule, with `expectedVersion` as one compare-and-delete: an update that lands
   * after the caller's read makes the delete 409 instead of being erased unseen.
   */
  async remove(ws: string, id: string, expectedVersion: number | undefined): Promise<void> {
    await this.get(ws, id);
    const r = docRemoveResult((await REMOVE.run(this.redis, [this.docKey(ws, id), this.listingKey(ws), this.versionKey(ws)],
      [expectedVersion === undefined ? '' : String(expectedVersion), id])) as unknown[]);
    if (r.kind === 'missing') throw new ApiError('validation.not_found', 'action policy not found');
    if (r.kind === 'stale') {
      const at = (JSON.parse(r.current) as ActionPolicy).version;
      throw new ApiError('validation.conflict', `expected_version ${expectedVersion ?? ''} ${staleOrAhead(expectedVersion, at)}; the policy is at version ${at}`);
    }
    crashPoint('action-policy-deleted');
  }

  /** The Workspace's compiled policy set as of now. */
  async current(ws: string): Promise<PolicySet> {
    // Through the read cache: Redis invalidates it the moment any process bumps the version.
    const version = (await cachedGet(this.redis, this.versionKey(ws))) ?? '0';
    const cached = this.cache.get(ws);
    if (cached && cached.version === version) return cached.set;
    const ids = await this.redis.zrange(keys.index(tags.workspace(ws), POLICIES), 0, -1);
    const docs: ActionPolicy[] = [];
    for (let i = 0; i < ids.length; i += 1000) docs.push(...(await this.docs.getMany<ActionPolicy>(tags.workspace(ws), ids.slice(i, i + 1000))));
    const set = new PolicySet(docs.map(toRule));
    this.cache.set(ws, { version, set });
    return set;
  }

  /**
   * The refusal of a tool use whose ActionApproval was denied or expired (the Run's re-check of
   * it): a decision of its own, recorded as the rule's decisions are (`denied`, the rule's id).
   */
  async recordSettled(ws: string, approval: { tool: { kind: string; name: string }; rule_id: string | null }, actor: DecisionContext['actor'], target: string): Promise<void> {
    try {
      await this.audit.append(ws, {
        actor, action: `policy.${approval.tool.kind}:${approval.tool.name}`, target, outcome: 'denied', status: null, detail: approval.rule_id ?? 'action_approval', request_id: null,
      });
    } catch (err) {
      this.log.error({ err, workspace: ws }, 'audit append of a policy decision failed');
    }
  }

  /** Evaluate without recording (the dry run). */
  async explain(ws: string, call: ToolCall): Promise<PolicyDecision> {
    return (await this.current(ws)).evaluate(call);
  }

  /**
   * Decide one call and record the decision in the audit log (when a rule decided it, or the
   * evaluation failed). Any failure to evaluate denies
   * (fail closed) and says so in the record.
   */
  async decide(ws: string, call: ToolCall, ctx: DecisionContext): Promise<PolicyDecision> {
    const pending = await this.decideUnrecorded(ws, call, ctx);
    await pending.record(ctx.target);
    return pending.decision;
  }

  /**
   * `decide`, with the audit record written by `record(target)` once the caller knows what the
   * decision guards (a request whose target is the resource it creates names it once created).
   * A decision no rule made has no record; `record` writes at most once.
   */
  async decideUnrecorded(ws: string, call: ToolCall, ctx: Omit<DecisionContext, 'target'>): Promise<PendingDecision> {
    let d: PolicyDecision;
    let failed = false;
    try {
      d = (await this.current(ws)).evaluate(call);
    } catch (err) {
      this.log.error({ err, workspace: ws, tool: call.name, request_id: ctx.request_id ?? undefined }, 'action policy evaluation failed; denying');
      failed = true;
      d = { decision: 'deny', rule_id: null, explanation: `${call.kind} tool '${call.name}': denied because the ActionPolicy evaluation failed (fail closed)`, matched: [] };
    }
    // A call no rule speaks to is allowed by default and not recorded (the floor costs no write).
    if (d.rule_id === null && !failed) return { decision: d, record: async () => undefined };
    const decision = d;
    let recorded = false;
    return {
      decision,
      record: async (target) => {
        if (recorded) return;
        recorded = true;
        try {
          await this.audit.append(ws, {
            actor: ctx.actor, action: `policy.${call.kind}:${call.name}`, target,
            outcome: failed ? 'error'
              : decision.decision === 'allow' ? 'allowed'
                : decision.decision === 'deny' || ctx.refusesApproval === true ? 'denied'
                  : ctx.settledApproval === 'approved' ? 'allowed' : ctx.settledApproval === 'denied' ? 'denied' : 'requested',
            status: null, detail: failed ? 'evaluation_failed' : decision.rule_id ?? 'default_allow', request_id: ctx.request_id ?? null,
          });
        } catch (err) {
          this.log.error({ err, workspace: ws, request_id: ctx.request_id ?? undefined }, 'audit append of a policy decision failed');
        }
      },
    };
  }

  /**
   * One call made for the Principals a Run acts for (its authors): decided, and recorded, for
   * each, the strictest decision standing (deny, then require_approval, then allow; the first
   * deny ends the loop); with no author, once for no Principal. Authors the caller has already
   * read (an array) are each decided. A reader (a function) is called only when some rule of the
   * Workspace names a Principal (otherwise the Principal cannot change the decision, which is then
   * made once, for no Principal); when it cannot read them it rejects, and the caller fails closed.
   */
  async decideForPrincipals(
    ws: string, call: Omit<ToolCall, 'principal_id'>, principals: readonly string[] | (() => Promise<readonly string[]>), ctx: DecisionContext,
  ): Promise<PolicyDecision> {
    let authors: readonly string[];
    if (typeof principals === 'function') {
      const scoped = await this.current(ws).then((set) => set.principalScoped, () => true);
      authors = scoped ? await principals() : [];
    } else {
      authors = principals;
    }
    let d: PolicyDecision | null = null;
    for (const principal_id of authors.length > 0 ? authors : [undefined]) {
      const one = await this.decide(ws, { ...call, principal_id }, ctx);
      if (!d || STRICTNESS[one.decision] > STRICTNESS[d.decision]) d = one;
      if (d.decision === 'deny') break;
    }
    return d as PolicyDecision;
  }
}
