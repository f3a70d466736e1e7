import { randomUUID } from 'node:crypto';
import {
  ApiError, ATTR, BUCKETS, check, context as otelContext, Counter, crashPoint, Histogram, incident, LOGICAL_KEY_PATTERN, scrubSecret, SpanKind, SpanStatusCode, tracer, tracingEnabled, type Logger, type Metrics, type Span, type Context,
} from '@agentplane/core';
import { tags, type DocumentStore, type StoredDoc } from '@agentplane/store';
import { ZERO_USAGE, type ModelError, type ModelRequest, type ModelStreamEvent, type TokenUsage } from '@agentplane/protocol';
import {
  estimateRequestTokens, findPrice, listCostNanoUsd, ProviderError, type PriceTable, type ProviderAdapter, type ProviderKey,
} from '@agentplane/models';
import type { BudgetGuard, BudgetReservation, SessionBudget } from './budget.js';
import type { LeaseStreams } from './lease-streams.js';
import type { ModelCredentialService } from './credentials.js';
import type { ModelCredentialDoc, RoutingCandidate } from './model.js';
import type { RoutingProfileService } from './profiles.js';
import type { UsageAccumulator } from './usage.js';
import { ModelRequestBody } from './schemas.js';

/** Who the step works for; usage is recorded against these and budgets are checked for them. */
export interface ModelStepContext {
  session_id?: string | undefined;
  thread_id?: string | undefined;
  run_id?: string | undefined;
  /** Unique per step (idempotent usage recording). Generated when absent. */
  step_id?: string | undefined;
  /**
   * The Session's `budget`, so a spent budget stops the turn at its next step. When absent and
   * `session_id` is given, it is read from the Session document.
   */
  session_budget?: SessionBudget | null | undefined;
  /**
   * A Session created against a deployment revision: the routing profile revision it pins. A
   * step whose routing key is that profile's key uses that revision's candidates.
   */
  routing_pin?: { model_routing_profile_id: string; model_routing_profile_revision_number: number } | null | undefined;
  /** The trace context the step is asked in (the parent of its provider calls' spans). */
  trace?: Context | undefined;
  /**
   * The runner lease the step is served under (with `session_id` and `run_id`): the step ends,
   * as an aborted one does, once that lease ends, on whichever node its Run is cancelled or its
   * lease revoked (`LeaseStreams`).
   */
  lease_id?: string | undefined;
}

/** A candidate that passed the constraints, with its credential. */
interface Eligible {
  candidate: RoutingCandidate;
  credential: ModelCredentialDoc;
}

export interface StepPlan {
  workspaceId: string;
  request: ModelRequest;
  context: ModelStepContext;
  candidates: Eligible[];
  /** The step's id (usage recording, budget reservation): the context's, or generated. */
  stepId: string;
  /** The step's estimated cost reserved against its budgets (null: no budget applies). */
  reservation: BudgetReservation | null;
}

export interface GatewayServiceOptions {
  prices: PriceTable;
  /** Per provider request: time to headers, and between chunks that carry content. */
  providerTimeoutMs: number;
  /** The whole step, from its first provider request to its end (default `DEFAULT_STEP_DEADLINE_MS`). */
  stepDeadlineMs?: number | undefined;
  /** The steps served under runner leases, ended when their lease ends (absent: a lease ends nothing here). */
  leases?: LeaseStreams | undefined;
}

/** The default overall deadline of one model step: 10 minutes. */
export const DEFAULT_STEP_DEADLINE_MS = 600_000;

/**
 * The output a step's budget reservation assumes when the request sets no `max_output_tokens`
 * (Anthropic's default maximum here too).
 */
export const RESERVED_OUTPUT_TOKENS = 4096;

/** Characters per token of the estimates (as the request-token estimator counts). */
const CHARS_PER_TOKEN = 4;

/** The characters of output one event carries (text, thinking, a tool call's name and input). */
function outputChars(ev: ModelStreamEvent): number {
  if (ev.type === 'text_delta' || ev.type === 'thinking_delta') return ev.text.length;
  if (ev.type === 'tool_use') return ev.name.length + JSON.stringify(ev.input ?? {}).length;
  return 0;
}

/**
 * The usage charged to a step that ended before its `end` (canceled, or its provider failed
 * after output): the provider's own counts so far where it sent some, else the input estimated
 * from the request; the output at least the emitted characters / 4.
 */
export function earlyUsage(request: ModelRequest, reported: TokenUsage | null, emittedChars: number): TokenUsage {
  const outputEstimate = Math.ceil(emittedChars / CHARS_PER_TOKEN);
  const base = reported ?? ZERO_USAGE;
  // Counts reported without the input (a `message_start` with no usage) leave it to the estimate.
  const input = base.input_tokens > 0 ? base.input_tokens : estimateRequestTokens(request);
  const output = Math.max(base.output_tokens, outputEstimate);
  return { ...base, input_tokens: input, output_tokens: output, total_tokens: input + output };
}

/**
 * The usage charged to a served step: the provider's counts, with what it left out estimated
 * as for `earlyUsage` (a compatible server that ignores `stream_options.include_usage`, a proxy
 * that drops `usage`). A real request has input, and output that reached the caller has
 * tokens: a zero there means the provider did not count it, and the step is not free.
 */
export function servedUsage(request: ModelRequest, usage: TokenUsage, emittedChars: number): TokenUsage {
  const noInput = usage.input_tokens <= 0;
  const noOutput = usage.output_tokens <= 0 && emittedChars > 0;
  if (!noInput && !noOutput) return usage;
  const input = noInput ? estimateRequestTokens(request) : usage.input_tokens;
  const output = noOutput ? Math.ceil(emittedChars / CHARS_PER_TOKEN) : usage.output_tokens;
  return { ...usage, input_tokens: input, output_tokens: output, total_tokens: input + output };
}

const KEY_RE = new RegExp(LOGICAL_KEY_PATTERN);

/**
 * What a candidate's step is reserved at for `usage` (nano-USD): its model's list price, or, for
 * a model the table does not price, the dearest price its provider has in the table. An unpriced
 * candidate's step is charged at the price of the model its provider reports, when the table has
 * one (`recordUsage`), and that is one of its provider's entries: so no step is charged more
 * than it reserved (for the usage estimated), and a budget is overshot by one step at most.
 */
export function reservedCostNanoUsd(prices: PriceTable, provider: string, model: string, usage: TokenUsage): number {
  const price = findPrice(prices, provider, model);
  if (price) return listCostNanoUsd(price, usage);
  return Math.max(0, ...Object.values(prices[provider] ?? {}).map((p) => listCostNanoUsd(p, usage)));
}

/**
 * The model gateway: one model step = resolve the routing profile, pick the first eligible
 * candidate, decrypt its credential in memory, stream the provider through its adapter, fall
 * back to the next candidate on 429/5xx/timeout (only while nothing was streamed yet), record
 * usage, and end with `end` or `error`. The runner gateway's `model.request` handler calls
 * `runModelStep`; REST's `model-steps` calls `plan` then `execute` so that 422/429 become HTTP
 * statuses before the stream starts.
 */
export class ModelGatewayService {
  constructor(
    private readonly credentials: ModelCredentialService,
    private readonly profiles: RoutingProfileService,
    private readonly usage: UsageAccumulator,
    private readonly budgets: BudgetGuard,
    private readonly adapters: Record<ProviderKey, ProviderAdapter>,
    private readonly options: GatewayServiceOptions,
    private readonly log: Logger,
    private readonly docs?: DocumentStore,
    metrics?: Metrics,
  ) {
    this.metricSteps = metrics && new Counter({
      name: 'agentplane_model_steps_total', labelNames: ['provider', 'outcome'] as const, registers: [metrics],
      help: 'Model steps by provider and outcome (served, canceled, fallback, no_eligible_model, budget_exceeded, provider_unavailable, provider_rejected, failed)',
    });
    this.metricTtft = metrics && new Histogram({
      name: 'agentplane_model_time_to_first_event_seconds', help: 'Provider call start to its first streamed event (time to first token), by provider',
      labelNames: ['provider'] as const, buckets: [...BUCKETS.modelTtft], registers: [metrics],
    });
  }

  private readonly metricSteps: Counter<'provider' | 'outcome'> | undefined;
  private readonly metricTtft: Histogram<'provider'> | undefined;

  /** Validate a model-gateway-v1 request that arrived as untyped JSON (a runner frame). */
  static parseRequest(value: unknown): ModelRequest {
    const body = check(ModelRequestBody, value, 'message');
    return { ...body, tools: body.tools ?? [] } as ModelRequest;
  }

  /**
   * The entry point for the runner gateway. Never throws: every failure is an `error` event
   * of a catalog type (`model.no_eligible_model`, also when a provider refuses the request;
   * `budget.exceeded`, also when the providers' rate limits stopped every candidate;
   * `runtime.internal` when a provider failed otherwise (server error, cut stream, timeout,
   * unreachable) or anything unexpected happened; `validation.malformed`). Aborting `signal`
   * aborts the provider request and ends the stream with `end` / stop_reason `canceled`; so does
   * the end of the lease the context names (`lease_id`).
   */
  async *runModelStep(workspaceId: string, request: ModelRequest | unknown, signal: AbortSignal, context: ModelStepContext = {}): AsyncGenerator<ModelStreamEvent> {
    const leases = this.options.leases;
    const { lease_id, session_id } = context;
    if (!leases || lease_id === undefined || session_id === undefined) return yield* this.step(workspaceId, request, signal, context);
    // Aborted by the caller or by the lease's end, whichever comes first; tracked until the step's end.
    const ctl = new AbortController();
    const follow = (): void => ctl.abort();
    if (signal.aborted) ctl.abort();
    else signal.addEventListener('abort', follow, { once: true });
    const untrack = leases.track({ workspace_id: workspaceId, session_id, run_id: context.run_id, lease_id }, follow);
    try {
      yield* this.step(workspaceId, request, ctl.signal, context);
    } finally {
      untrack();
      signal.removeEventListener('abort', follow);
    }
  }

  private async *step(workspaceId: string, request: ModelRequest | unknown, signal: AbortSignal, context: ModelStepContext): AsyncGenerator<ModelStreamEvent> {
    let plan: StepPlan;
    try {
      plan = await this.plan(workspaceId, ModelGatewayService.parseRequest(request), context);
    } catch (err) {
      yield { type: 'error', error: toModelError(err) };
      return;
    }
    yield* this.execute(plan, signal);
  }

  /** Budget check and candidate selection. Throws ApiError 422 / 429 / 400. */
  async plan(workspaceId: string, request: ModelRequest, context: ModelStepContext = {}): Promise<StepPlan> {
    try {
      return await this.planInner(workspaceId, request, context);
    } catch (err) {
      this.metricSteps?.inc({ provider: 'none', outcome: err instanceof ApiError ? err.type.replace(/^.*\./, '') : 'failed' });
      throw err;
    }
  }

  /** The routing key's latest revision, or the pinned revision when the pin names that key's profile. */
  private async resolveProfile(workspaceId: string, key: string, pin: ModelStepContext['routing_pin']) {
    if (pin) {
      const profile = await this.profiles.getDoc(workspaceId, pin.model_routing_profile_id).catch(() => null);
      if (profile && profile.key === key) return { profile, revision: await this.profiles.revision(workspaceId, profile.id, pin.model_routing_profile_revision_number) };
    }
    return this.profiles.resolve(workspaceId, key);
  }

  private async planInner(workspaceId: string, request: ModelRequest, context: ModelStepContext): Promise<StepPlan> {
    if (!KEY_RE.test(request.routing_key)) throw new ApiError('validation.malformed', 'routing_key is not a logical key');
    if (context.session_id && context.session_budget === undefined && this.docs) {
      const session = await this.docs.get<StoredDoc & { workspace_id?: string; budget?: SessionBudget | null }>(tags.session(context.session_id), context.session_id);
      if (session && session.workspace_id !== workspaceId) throw new ApiError('validation.not_found', 'session not found');
      context = { ...context, session_budget: session?.budget ?? null };
    }
    // The workspace budget (cached) and the profile lookup are independent reads: one round trip less.
    const subject = { workspace_id: workspaceId, session_id: context.session_id, session_budget: context.session_budget };
    const [workspaceBudget, resolved] = await Promise.all([
      this.budgets.getWorkspaceBudget(workspaceId),
      this.profiles.ensureDefaults(workspaceId).then(() => this.resolveProfile(workspaceId, request.routing_key, context.routing_pin)),
    ]);
    if (!resolved) {
      // A spent budget is the answer before a missing profile.
      await this.budgets.check(subject);
      throw new ApiError('model.no_eligible_model', `no model routing profile has the key '${request.routing_key}'`);
    }
    const reasons: string[] = [];
    const eligible: Eligible[] = [];
    const inputEstimate = estimateRequestTokens(request);
    const verdicts = await Promise.all(resolved.revision.candidates.map((c) => this.ineligible(workspaceId, c, request, inputEstimate)));
    for (const [i, c] of resolved.revision.candidates.entries()) {
      const why = verdicts[i] as string | ModelCredentialDoc;
      if (typeof why === 'string') reasons.push(`#${i + 1} ${c.credential_key}/${c.provider_model}: ${why}`);
      else eligible.push({ candidate: c, credential: why });
    }
    if (eligible.length === 0) {
      await this.budgets.check(subject);
      throw new ApiError('model.no_eligible_model', `no candidate of routing profile '${request.routing_key}' (revision ${resolved.revision.revision_number}) fits: ${reasons.join('; ')}`);
    }
    const stepId = context.step_id ?? randomUUID();
    // The step's worst case (the estimated input and all the output it may ask for, at the
    // dearest eligible candidate's price) is reserved against its budgets until it ends.
    const worst: TokenUsage = { ...ZERO_USAGE, input_tokens: inputEstimate, output_tokens: request.max_output_tokens ?? RESERVED_OUTPUT_TOKENS };
    worst.total_tokens = worst.input_tokens + worst.output_tokens;
    const estimate = Math.max(0, ...eligible.map((e) => reservedCostNanoUsd(this.options.prices, e.credential.provider_key, e.candidate.provider_model, worst)));
    const reservation = await this.budgets.reserve({ ...subject, workspace_budget: workspaceBudget, step_id: stepId, amount_nano_usd: estimate, ttl_ms: this.reservationTtlMs });
    return { workspaceId, request, context, candidates: eligible, stepId, reservation };
  }

  /** Why a candidate cannot serve the request, or its credential when it can. */
  private async ineligible(ws: string, c: RoutingCandidate, request: ModelRequest, inputEstimate: number): Promise<string | ModelCredentialDoc> {
    const cred = await this.credentials.byKey(ws, c.credential_key);
    if (!cred) return 'no active credential with that key';
    const k = c.constraints ?? {};
    if (request.tools.length > 0 && k.tool_use === false) return 'no tool use';
    if (k.context_window_tokens !== undefined && inputEstimate + (request.max_output_tokens ?? 0) > k.context_window_tokens) {
      return `request of about ${inputEstimate} tokens exceeds the context window of ${k.context_window_tokens}`;
    }
    if (k.max_input_usd_per_mtok !== undefined || k.max_output_usd_per_mtok !== undefined) {
      const price = findPrice(this.options.prices, cred.provider_key, c.provider_model);
      if (!price) return 'the model has no list price and the candidate sets a price ceiling';
      if (k.max_input_usd_per_mtok !== undefined && price.input > k.max_input_usd_per_mtok) return `input price ${price.input} USD/MTok is over the ceiling`;
      if (k.max_output_usd_per_mtok !== undefined && price.output > k.max_output_usd_per_mtok) return `output price ${price.output} USD/MTok is over the ceiling`;
    }
    return cred;
  }

  private get stepDeadlineMs(): number {
    return this.options.stepDeadlineMs ?? DEFAULT_STEP_DEADLINE_MS;
  }

  /** How long a step's budget reservation holds at most: past its deadline and its throttle waits. */
  private get reservationTtlMs(): number {
    return this.stepDeadlineMs + THROTTLE_WAITS * THROTTLE_WAIT_MAX_SECONDS * 1000 + 60_000;
  }

  /**
   * Stream the plan's candidates in order until one serves the step, within the step deadline.
   * Never throws. The plan's budget reservation is released when the step ends (its cost is
   * recorded by then), also when the caller leaves early, and at once when the caller gives the
   * stream up (`return` or `throw`) before reading its first event: a generator that never ran
   * would keep it until it expires.
   */
  execute(plan: StepPlan, signal: AbortSignal): AsyncGenerator<ModelStreamEvent> {
    const steps = this.executeSteps(plan, signal);
    let started = false;
    const unstarted = async (): Promise<void> => {
      if (started) return;
      started = true;
      await plan.reservation?.release();
    };
    const stream: AsyncGenerator<ModelStreamEvent> = {
      next: (...args) => {
        started = true;
        return steps.next(...args);
      },
      return: async (value) => {
        await unstarted();
        return steps.return(value);
      },
      throw: async (err: unknown) => {
        await unstarted();
        return steps.throw(err);
      },
      [Symbol.asyncIterator]: () => stream,
    };
    return stream;
  }

  private async *executeSteps(plan: StepPlan, signal: AbortSignal): AsyncGenerator<ModelStreamEvent> {
    try {
      if (signal.aborted) {
        // The caller left before the step started (a REST client gone while the step was
        // planned): no provider call, the step ends canceled and its reservation goes below.
        const first = plan.candidates[0];
        this.metricSteps?.inc({ provider: first?.credential.provider_key ?? 'none', outcome: 'canceled' });
        yield { type: 'end', stop_reason: 'canceled', usage: { ...ZERO_USAGE }, provider: first?.credential.provider_key ?? 'none', model: first?.candidate.provider_model ?? '' };
        return;
      }
      yield* this.executeInner(plan, signal);
    } finally {
      await plan.reservation?.release();
    }
  }

  private async *executeInner(plan: StepPlan, signal: AbortSignal): AsyncGenerator<ModelStreamEvent> {
    const stepId = plan.stepId;
    const deadlineAt = performance.now() + this.stepDeadlineMs;
    for (let waited = 0; ; waited++) {
      const failures = yield* this.pass(plan, stepId, signal, deadlineAt);
      if (failures === null) return;
      // Every candidate throttled: wait out a short throttle and try them again, as the
      // providers' own SDKs do; a limit that clears later ends the step (`budget.exceeded`).
      const throttle = waited < THROTTLE_WAITS ? throttleWait(failures, waited) : null;
      const wait = throttle !== null && performance.now() + throttle * 1000 < deadlineAt ? throttle : null;
      if (wait !== null) {
        this.log.info({ step_id: stepId, wait_seconds: wait }, 'model providers throttled every candidate; trying again after their wait');
        if (await abortableDelay(wait * 1000, signal)) continue;
        const first = plan.candidates[0];
        yield { type: 'end', stop_reason: 'canceled', usage: { ...ZERO_USAGE }, provider: first?.credential.provider_key ?? 'none', model: first?.candidate.provider_model ?? '' };
        return;
      }
      this.metricSteps?.inc({ provider: 'none', outcome: 'provider_unavailable' });
      yield { type: 'error', error: this.providerFailure(stepId, failures, `every eligible candidate failed: ${failures.map((f) => f.message).join('; ')}`) };
      return;
    }
  }

  /**
   * One pass over the plan's candidates in order until one serves the step: its events are the
   * step's. Returns null once the step has ended (served, or an `error` or a canceled `end`
   * yielded), or every candidate's failure when each failed retryably before any output.
   */
  private async *pass(plan: StepPlan, stepId: string, signal: AbortSignal, deadlineAt: number): AsyncGenerator<ModelStreamEvent, ProviderError[] | null> {
    const { request, context } = plan;
    const failures: ProviderError[] = [];
    // Candidates whose credential was revoked since the plan: skipped, as the plan skips them.
    const revoked: string[] = [];
    for (const { candidate, credential } of plan.candidates) {
      const left = Math.floor(deadlineAt - performance.now());
      if (left < MIN_CALL_MS) {
        failures.push(new ProviderError('timeout', `the model step reached its deadline of ${this.stepDeadlineMs} ms`));
        break;
      }
      let emitted = false;
      // What the step is charged when it ends before its `end` (recorded once, see `earlyUsage`).
      let recorded = false;
      let emittedChars = 0;
      let reported: TokenUsage | null = null;
      let secret: string | null = null;
      // The credential as its secret was unsealed (its live generation, which the plan's copy may predate).
      let used: ModelCredentialDoc = credential;
      // Providers echo (parts of) a rejected key in their messages; none of it leaves the gateway.
      const scrub = (text: string) => scrubSecret(text, secret);
      // One CLIENT span per provider call (GenAI semantic conventions): names and counts only.
      const span: Span | undefined = tracingEnabled()
        ? tracer().startSpan(`chat ${candidate.provider_model}`, {
          kind: SpanKind.CLIENT,
          attributes: {
            [ATTR.genAiOperationName]: 'chat', [ATTR.genAiProviderName]: credential.provider_key, [ATTR.genAiRequestModel]: candidate.provider_model,
            'agentplane.model.routing_key': request.routing_key,
          },
        }, context.trace ?? otelContext.active())
        : undefined;
      try {
        const adapter = this.adapters[credential.provider_key];
        const started = performance.now();
        // The secret lives in this scope for the duration of one provider call only.
        try {
          ({ secret, doc: used } = await this.credentials.unseal(credential));
        } catch (err) {
          // A secret that cannot be read now (rotated over and over meanwhile, or missing): this
          // candidate fails as a provider that cannot be reached does, and the next one is tried.
          if (err instanceof ApiError && err.type === 'validation.conflict') throw new ProviderError('server', `the credential's secret could not be read: ${err.message}`);
          if (!(err instanceof ApiError && err.type === 'model.no_eligible_model')) throw err;
          span?.setAttribute('error.type', 'credential_revoked');
          revoked.push(`${credential.key}/${candidate.provider_model}`);
          continue;
        }
        const stream = adapter.stream({
          request, model: candidate.provider_model, baseUrl: credential.base_url, apiKey: secret, timeoutMs: this.options.providerTimeoutMs,
          deadlineMs: left, onUsage: (u) => { reported = u; },
        }, signal);
        for await (const ev of stream) {
          if (!emitted) this.metricTtft?.observe({ provider: credential.provider_key }, (performance.now() - started) / 1000);
          if (ev.type !== 'end') {
            emitted = true;
            emittedChars += outputChars(ev);
            yield ev;
            continue;
          }
          recorded = true;
          this.metricSteps?.inc({ provider: credential.provider_key, outcome: 'served' });
          span?.setAttributes({
            [ATTR.genAiResponseModel]: ev.model, [ATTR.genAiUsageInputTokens]: ev.usage.input_tokens, [ATTR.genAiUsageOutputTokens]: ev.usage.output_tokens,
            [ATTR.genAiResponseFinishReasons]: [ev.stop_reason],
          });
          // What the provider left uncounted is estimated; the `end` tells the caller what was charged.
          const charged = servedUsage(request, ev.usage, emittedChars);
          await this.recordUsage(plan, stepId, credential.provider_key, candidate.provider_model, charged, ev.model);
          // Charged and released (one script per budget): a crash here leaves neither held.
          crashPoint('model-step-charged');
          this.log.debug({ step_id: stepId, model_credential_id: credential.id, provider: credential.provider_key, model: ev.model, ms: Math.round(performance.now() - started) }, 'model step served');
          yield { ...ev, usage: charged, provider: credential.provider_key };
          return null;
        }
        throw new ProviderError('server', `${credential.provider_key} ended without an end event`);
      } catch (err) {
        span?.setStatus({ code: SpanStatusCode.ERROR });
        span?.setAttribute('error.type', ProviderError.is(err) ? err.kind : signal.aborted ? 'canceled' : 'internal');
        if (!ProviderError.is(err)) {
          if (signal.aborted) {
            yield { type: 'end', stop_reason: 'canceled', usage: { ...ZERO_USAGE }, provider: credential.provider_key, model: candidate.provider_model };
            return null;
          }
          this.metricSteps?.inc({ provider: credential.provider_key, outcome: 'failed' });
          this.log.error({ err: (err as Error).message, step_id: stepId, model_credential_id: credential.id }, 'model step failed');
          yield { type: 'error', error: toModelError(err) };
          return null;
        }
        if (err.kind === 'canceled') {
          this.metricSteps?.inc({ provider: credential.provider_key, outcome: 'canceled' });
          yield { type: 'end', stop_reason: 'canceled', usage: { ...ZERO_USAGE }, provider: credential.provider_key, model: candidate.provider_model };
          return null;
        }
        this.log.warn({
          step_id: stepId, model_credential_id: credential.id, credential_key: credential.key, provider: credential.provider_key,
          model: candidate.provider_model, failure: err.kind, status: err.status, retry_after_seconds: err.retryAfterSeconds, after_output: emitted,
        }, 'model provider call failed');
        if (err.kind === 'auth') await this.credentials.markHealth(used, 'unhealthy');
        if (!err.retryable) {
          this.metricSteps?.inc({ provider: credential.provider_key, outcome: 'provider_rejected' });
          yield { type: 'error', error: { type: 'model.no_eligible_model', message: scrub(`${credential.key}/${candidate.provider_model}: ${err.message}`), retryable: false } };
          return null;
        }
        this.metricSteps?.inc({ provider: credential.provider_key, outcome: emitted ? 'provider_unavailable' : 'fallback' });
        failures.push(new ProviderError(err.kind, scrub(err.message), { status: err.status, retryAfterSeconds: err.retryAfterSeconds }));
        if (emitted) {
          // Output already reached the harness; falling back would splice two answers together.
          yield { type: 'error', error: this.providerFailure(stepId, [err], scrub(`${credential.key}/${candidate.provider_model} failed mid-stream: ${err.message}`)) };
          return null;
        }
      } finally {
        span?.end();
        // Output reached the caller and the step ended without its `end` (canceled, the
        // provider failed, or the caller stopped reading): it is charged a best-effort usage.
        if (emitted && !recorded) {
          recorded = true;
          await this.recordUsage(plan, stepId, credential.provider_key, candidate.provider_model, earlyUsage(request, reported, emittedChars));
        }
      }
    }
    if (failures.length === 0 && revoked.length > 0) {
      this.metricSteps?.inc({ provider: 'none', outcome: 'no_eligible_model' });
      yield { type: 'error', error: { type: 'model.no_eligible_model', message: `the model credential of every candidate was revoked during the step: ${revoked.join(', ')}`, retryable: false } };
      return null;
    }
    return failures;
  }

  /**
   * Price and record one step's usage (idempotent by step id); a failure is logged, never thrown.
   * The price is the routing candidate's model's (the one its budget reservation and price
   * ceilings were judged by), so a provider that names its model otherwise cannot make a step
   * free; the model the provider reported prices it only when the candidate's has no price.
   * The step's budget reservation is released by the same scripts that charge it.
   */
  private async recordUsage(plan: StepPlan, stepId: string, provider: string, model: string, usage: TokenUsage, reportedModel?: string): Promise<void> {
    const { context, workspaceId, reservation } = plan;
    const price = findPrice(this.options.prices, provider, model) ?? (reportedModel === undefined ? null : findPrice(this.options.prices, provider, reportedModel));
    const cost = price ? listCostNanoUsd(price, usage) : null;
    try {
      await this.usage.record({ workspace_id: workspaceId, session_id: context.session_id, thread_id: context.thread_id, run_id: context.run_id, step_id: stepId }, usage, cost, new Date(), reservation?.entries);
      reservation?.settled();
    } catch (err) {
      this.log.error({ err: (err as Error).message, step_id: stepId }, 'model usage was not recorded');
    }
  }

  /**
   * The step's error after retryable provider failures. Every credential a routing profile names
   * is the workspace's own, so these are the workspace's providers failing, never the platform's
   * capacity (`model.platform_capacity_reached` is kept for that): throttled by their rate limits
   * or quotas throughout, `budget.exceeded` (retryable when a provider said when); a server
   * error, a cut stream, a timeout or an unreachable provider, `runtime.internal`, whose message
   * names an incident reference that the log line carries too.
   */
  private providerFailure(stepId: string, failures: readonly ProviderError[], message: string): ModelError {
    const hints = failures.map((f) => f.retryAfterSeconds).filter((s): s is number => s !== null);
    const retryAfter = hints.length > 0 ? { retry_after_seconds: Math.max(1, Math.ceil(Math.min(...hints))) } : {};
    if (failures.every((f) => f.kind === 'rate_limited')) {
      return { type: 'budget.exceeded', message: `the model provider's rate limit was reached: ${message}`, retryable: hints.length > 0, ...retryAfter };
    }
    const inc = incident(message);
    this.log.warn({ step_id: stepId, incident: inc.incident, failures: failures.map((f) => f.kind) }, 'model step failed: the model provider failed');
    return { type: 'runtime.internal', message: inc.message, retryable: true, ...retryAfter };
  }
}

/** A provider call is not started with less of the step deadline left than this (ms). */
const MIN_CALL_MS = 50;

/** How many times a step waits out its providers' throttling before it fails `budget.exceeded`. */
const THROTTLE_WAITS = 2;
/** The longest throttle (seconds) a step waits out; a limit that clears later ends the step. */
const THROTTLE_WAIT_MAX_SECONDS = 10;

/**
 * The seconds to wait before trying the candidates again, when every one of `failures` was a
 * rate limit: the shortest Retry-After the providers sent, or without one 1 s then 2 s; null when
 * not every failure was a rate limit or the wait is longer than a step waits.
 */
export function throttleWait(failures: readonly ProviderError[], waited: number): number | null {
  if (failures.length === 0 || !failures.every((f) => f.kind === 'rate_limited')) return null;
  const hints = failures.map((f) => f.retryAfterSeconds).filter((s): s is number => s !== null);
  const wait = hints.length > 0 ? Math.max(0, Math.min(...hints)) : 2 ** waited;
  return wait <= THROTTLE_WAIT_MAX_SECONDS ? wait : null;
}

/** Resolves true after `ms`, or false as soon as `signal` aborts. */
function abortableDelay(ms: number, signal: AbortSignal): Promise<boolean> {
  if (signal.aborted) return Promise.resolve(false);
  return new Promise((resolve) => {
    const done = (ok: boolean): void => {
      clearTimeout(timer);
      signal.removeEventListener('abort', onAbort);
      resolve(ok);
    };
    const onAbort = (): void => done(false);
    const timer = setTimeout(() => done(true), ms);
    signal.addEventListener('abort', onAbort, { once: true });
  });
}

/** Remove a secret, and any 8+ character run of it, from a provider message. */
export { scrubSecret };

export function toModelError(err: unknown): ModelError {
  if (err instanceof ApiError) {
    const retryAfter = err.headers['Retry-After'];
    return { type: err.type, message: err.message, retryable: err.status >= 500 || (err.status === 429 && retryAfter !== undefined), ...(retryAfter ? { retry_after_seconds: Number(retryAfter) } : {}) };
  }
  return { type: 'runtime.internal', message: 'the model step failed unexpectedly', retryable: true };
}
