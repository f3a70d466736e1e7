import { createHash } from 'node:crypto';
import { DelayedError, type Queue, type Job } from 'bullmq';
import { ApiError, crashPoint, newId, nowIso, type Logger, staleOrAhead } from '@agentplane/core';
import { keys, tags, type DocumentStore, type LogEvent, type Redis, type StoredDoc } from '@agentplane/store';
import { QueueHost } from '../queue-host.js';
import { createdId, earlierAttempt } from '../http/keyed-create.js';
import type { KeyedRequest } from '../http/idempotency.js';
import { ZERO_USAGE, type TokenUsage } from '@agentplane/protocol';
import {
  checkSkillFiles, parseFrontMatter, renderSkillMd, SKILL_ENTRY, SKILL_NAME_RE, SKILLS_DIR, type SessionDoc, type SkillFile, type SpecSkill,
} from '@agentplane/domain';
import type { SessionService } from '../sessions/service.js';
import type { IdentityService } from '@agentplane/domain';
import type { ModelsModule } from '../models/module.js';
import type { SkillService } from '../skills/service.js';
import type { SessionEventTap, TappedAppend } from '../events/tap.js';
import { Scratch, remoteHead, type GitRemote } from '../skill-sources/git.js';
import { isBranchName, type SkillSourceService } from '../skill-sources/service.js';
import { consistencyViolation, publicProposal, type ProposalError, type SkillProposalDoc, type SubmissionAttempt, type VerificationResult } from './model.js';
import { authoringRequest, authoringStepId, parseAuthoredSkill, readTranscript, TRANSCRIPT_LIMIT_CHARS } from './authoring.js';

export const SKILL_PROPOSAL_QUEUE_PREFIX = 'ap:{q:skill_proposals}';
const QUEUE = 'skill_proposals';
const INDEX = 'skill_proposals';
const WATCH_MAX_DELAY_MS = 10_000;
/** Proposals whose work a crash could lose (authoring, verifying): `<ws>/<skp>`, score = ms last looked at. */
const OUTBOX = keys.global('skill_proposal_outbox');
const SWEEP_MS = 10_000;
const AUTHOR_ATTEMPTS = 3;

interface AuthorJob { workspace_id: string; proposal_id: string }
interface WatchJob { workspace_id: string; proposal_id: string; session_id: string; polls?: number }
interface AdoptJob { workspace_id: string; proposal_id: string; polls?: number }

export interface SkillProposalServiceDeps {
  redisUrl: string;
  redis: Redis;
  docs: DocumentStore;
  sessions: SessionService;
  models: ModelsModule;
  skills: SkillService;
  sources: SkillSourceService;
  tap: SessionEventTap;
  identity: IdentityService;
  log: Logger;
  /** How often a submitted proposal's source is checked for its adoption (ms). */
  adoptionPollMs: number;
}

const addUsage = (a: TokenUsage, b: Partial<TokenUsage>): TokenUsage => ({
  input_tokens: a.input_tokens + (b.input_tokens ?? 0),
  cached_input_tokens: a.cached_input_tokens + (b.cached_input_tokens ?? 0),
  cache_write_input_tokens: a.cache_write_input_tokens + (b.cache_write_input_tokens ?? 0),
  output_tokens: a.output_tokens + (b.output_tokens ?? 0),
  reasoning_output_tokens: a.reasoning_output_tokens + (b.reasoning_output_tokens ?? 0),
  total_tokens: a.total_tokens + (b.total_tokens ?? 0),
});

const invalid = (p: SkillProposalDoc, op: string) =>
  new ApiError('runtime.invalid_transition', `${op} is not possible while the skill proposal is ${p.status}`);

/** The drafted skill's files: its one `SKILL.md`. */
const draftFiles = (p: SkillProposalDoc): SkillFile[] => [{ path: SKILL_ENTRY, content: Buffer.from(p._content ?? '', 'utf8'), executable: false }];

/**
 * Skill proposals (docs/SKILLS.md): authoring from Session logs, verification in one isolated
 * graded Session, submission to a git skill source, adoption. Work runs on the
 * `skill_proposals` BullMQ queue in every api process (`author`, `watch`, `adopt` jobs).
 */
export class SkillProposalService {
  private readonly host: QueueHost;
  readonly queue: Queue;

  constructor(private readonly d: SkillProposalServiceDeps) {
    this.host = new QueueHost({ name: 'skill-proposals', label: 'skill proposals', queue: QUEUE, prefix: SKILL_PROPOSAL_QUEUE_PREFIX, redisUrl: d.redisUrl, log: d.log });
    this.queue = this.host.queue;
  }

  // ---- documents -----------------------------------------------------------------------------

  private async load(ws: string, id: string): Promise<SkillProposalDoc> {
    const p = await this.d.docs.get<SkillProposalDoc>(tags.workspace(ws), id);
    if (!p || p.type !== 'skill_proposal' || p.workspace_id !== ws) throw new ApiError('validation.not_found', `skill proposal ${id} not found`);
    return p;
  }

  /** Compare-and-swap with the consistency rules checked on every next state. */
  private update(ws: string, id: string, mutate: (cur: SkillProposalDoc) => SkillProposalDoc | null, options: { expectedVersion?: number; current?: SkillProposalDoc } = {}): Promise<SkillProposalDoc> {
    return this.d.docs.update<SkillProposalDoc>(tags.workspace(ws), id, (cur) => {
      const next = mutate(cur);
      if (next) {
        const broken = consistencyViolation(next);
        if (broken) throw new Error(`skill proposal ${id}: a write would break a consistency rule: ${broken}`);
      }
      return next;
    }, { notFound: `skill proposal ${id}`, ...options });
  }

  view(p: SkillProposalDoc): Record<string, unknown> {
    return publicProposal(p);
  }

  // ---- create and authoring ------------------------------------------------------------------

  /**
   * With an Idempotency-Key the proposal's id is derived from the key and the request
   * (`createdId`): a retry whose first attempt died after writing it is answered that proposal as
   * it is now (its authoring may have moved it on), and its authoring job is queued again if it is
   * still authoring (the same job id, and a job finds a proposal out of `authoring` nothing to do).
   */
  async create(
    ws: string, body: { source_session_ids: string[]; model_routing_profile_key: string; instructions?: string | undefined; skill_name?: string | undefined },
    keyed?: KeyedRequest,
  ): Promise<SkillProposalDoc> {
    const id = createdId('skillProposal', keyed);
    const earlier = keyed ? await this.earlierCreate(ws, id, keyed) : null;
    if (earlier) {
      if (earlier.status === 'authoring') await this.queueAuthoring(ws, id);
      return earlier;
    }
    if (new Set(body.source_session_ids).size !== body.source_session_ids.length) {
      throw new ApiError('validation.malformed', 'body.source_session_ids: each Session at most once');
    }
    // An erased Session of this Workspace is accepted here and fails authoring with
    // `input_session_unavailable`; one that never existed here is a 404.
    const sessions: SessionDoc[] = [];
    for (const [i, id] of body.source_session_ids.entries()) {
      const s = await this.d.docs.get<SessionDoc | (StoredDoc & { type: 'session_tombstone'; workspace_id: string })>(tags.session(id), id);
      if (!s || (s.type !== 'session' && s.type !== 'session_tombstone') || s.workspace_id !== ws) {
        throw new ApiError('validation.not_found', `body.source_session_ids[${i}]: session ${id} not found`);
      }
      if (s.type === 'session') sessions.push(s);
    }
    const first = sessions[0];
    if (!first) throw new ApiError('validation.not_found', 'body.source_session_ids: every Session was deleted');
    await this.d.models.profiles.requireKey(ws, body.model_routing_profile_key, 'body.model_routing_profile_key');
    const now = nowIso();
    const p: SkillProposalDoc = {
      id, type: 'skill_proposal', workspace_id: ws, status: 'authoring', source_session_ids: body.source_session_ids,
      agent: first.agent.id, model_routing_profile_key: body.model_routing_profile_key, instructions: body.instructions ?? null,
      verifications: [], usage: { ...ZERO_USAGE }, _skill_name: body.skill_name ?? null, _environment_id: first.environment_id,
      version: 1, created_at: now, updated_at: now,
    };
    // The outbox entry goes first: a process that dies once the proposal is written, before its
    // job is queued, leaves the sweep an entry to queue it from (one for a proposal never
    // written is dropped by the sweep).
    await this.d.redis.zadd(OUTBOX, Date.now(), `${ws}/${p.id}`);
    await this.d.docs.create(tags.workspace(ws), p, [INDEX]);
    crashPoint('skill-proposal-created');
    await this.queueAuthoring(ws, p.id);
    return p;
  }

  /**
   * What an earlier attempt of this keyed create wrote under `id`, when it answers this request
   * (`earlierAttempt`). Only the proposal's own authoring moves it to `drafted` or
   * `authoring_failed`: that is no change by a client, so the proposal is answered as it is now.
   * One a client moved on since (verify, discard, submit) is refused as a reused key.
   */
  private async earlierCreate(ws: string, id: string, keyed: KeyedRequest): Promise<SkillProposalDoc | null> {
    const p = await this.d.docs.get<SkillProposalDoc>(tags.workspace(ws), id);
    if (!p || p.type !== 'skill_proposal' || p.workspace_id !== ws) return null;
    const untouched = (d: SkillProposalDoc) => d.status === 'authoring' || ((d.status === 'drafted' || d.status === 'authoring_failed') && d.verifications.length === 0);
    return earlierAttempt(p, keyed, (d) => d.version === 1 || untouched(d));
  }

  /** Queues the proposal's authoring job: one job id per proposal, so never twice at once. */
  private async queueAuthoring(ws: string, id: string): Promise<void> {
    await this.queue.add('author', { workspace_id: ws, proposal_id: id } satisfies AuthorJob, {
      jobId: `author-${id}`, attempts: AUTHOR_ATTEMPTS, backoff: { type: 'exponential', delay: 500 }, removeOnComplete: true, removeOnFail: { age: 24 * 3600 },
    });
  }

  private async failAuthoring(ws: string, id: string, error: ProposalError, usage?: Partial<TokenUsage>): Promise<void> {
    await this.update(ws, id, (cur) => cur.status !== 'authoring' ? null : {
      ...cur, status: 'authoring_failed', error, usage: usage ? addUsage(cur.usage, usage) : cur.usage,
    });
  }

  /**
   * The authoring job: every source log once, one model step, the drafted artifact. Safe to run
   * again; each attempt's model step is its own (charged once per attempt: `authoringStepId`).
   */
  private async author(job: Job<AuthorJob>): Promise<void> {
    const { workspace_id: ws, proposal_id: id } = job.data;
    const p = await this.d.docs.get<SkillProposalDoc>(tags.workspace(ws), id);
    if (!p || p.status !== 'authoring') return;
    const transcripts: string[] = [];
    let size = 0;
    for (const sid of p.source_session_ids) {
      const s = await this.d.docs.get<SessionDoc>(tags.session(sid), sid);
      const state = await this.d.sessions.store.log.state(sid);
      if (!s || s.type !== 'session' || state.erased) return this.failAuthoring(ws, id, 'input_session_unavailable');
      // Read a page at a time, given up as soon as the transcripts pass their limit.
      const text = await readTranscript(this.d.sessions.store.log, sid, TRANSCRIPT_LIMIT_CHARS - size);
      if (text === null) return this.failAuthoring(ws, id, 'input_sessions_too_large');
      size += text.length;
      transcripts.push(text);
    }
    const request = authoringRequest(p, transcripts);
    let text = '';
    let usage: Partial<TokenUsage> = {};
    const abort = new AbortController();
    for await (const ev of this.d.models.gateway.runModelStep(ws, request, abort.signal, { step_id: authoringStepId(id, job) })) {
      if (ev.type === 'text_delta') text += ev.text;
      else if (ev.type === 'end') usage = ev.usage;
      else if (ev.type === 'error') {
        this.d.log.warn({ proposal: id, err: ev.error.message, type: ev.error.type }, 'skill authoring model step failed');
        // A provider that is only unavailable for now is retried by the job; a reached limit (a
        // budget, a provider's rate limit) clears only with that limit, and it and anything else
        // fail the proposal.
        if (ev.error.retryable && ev.error.type !== 'budget.exceeded') throw new Error(ev.error.message);
        return this.failAuthoring(ws, id, 'authoring_failed');
      }
    }
    const authored = parseAuthoredSkill(text);
    const name = p._skill_name ?? authored?.name ?? '';
    if (!authored || !SKILL_NAME_RE.test(name)) return this.failAuthoring(ws, id, 'authoring_failed', usage);
    const content = renderSkillMd(name, authored.description, authored.instructions);
    let digest: string;
    try {
      parseFrontMatter(content);
      digest = checkSkillFiles([{ path: SKILL_ENTRY, content: Buffer.from(content, 'utf8'), executable: false }], 'skill').digest;
    } catch {
      return this.failAuthoring(ws, id, 'authoring_failed', usage);
    }
    await this.update(ws, id, (cur) => cur.status !== 'authoring' ? null : {
      ...cur, status: 'drafted', usage: addUsage(cur.usage, usage), _content: content,
      skill: { name, description: authored.description, kind: 'instructional', entry: SKILL_ENTRY, content_sha256: digest },
      verification_material: { task: authored.task, rubric: authored.rubric },
    });
  }

  // ---- verification --------------------------------------------------------------------------

  /**
   * From `drafted` or `verification_failed` at `expected_version`: records the attempt with its
   * Session id reserved, then launches that Session. A retry of the same request (the attempt's
   * `source_version` and Principal) resumes the launch and never creates a second Session.
   */
  async verify(ws: string, id: string, body: { expected_version: number; principal: string }): Promise<SkillProposalDoc> {
    let p = await this.reconcile(ws, await this.load(ws, id));
    const isRetry = (x: SkillProposalDoc) => {
      const last = x.verifications.at(-1);
      return last !== undefined && last.source_version === body.expected_version && last.principal === body.principal && x.status !== 'drafted'
        && !(x.status === 'verification_failed' && x.version === body.expected_version);
    };
    if (!isRetry(p)) {
      if (p.status !== 'drafted' && p.status !== 'verification_failed') throw invalid(p, 'verify');
      if (p.version !== body.expected_version) throw new ApiError('validation.conflict', `expected_version ${body.expected_version} ${staleOrAhead(body.expected_version, p.version)}; the current version is ${p.version}`);
      await this.d.identity.activePrincipal(ws, body.principal, 'principal');
      await this.d.models.profiles.requireKey(ws, p.model_routing_profile_key, 'model_routing_profile_key');
      const session = newId('session');
      // The outbox entry before the attempt is recorded: a process that dies in between leaves
      // the sweep an entry to launch the attempt from (it drops one whose proposal is not verifying).
      await this.d.redis.zadd(OUTBOX, Date.now(), `${ws}/${id}`);
      try {
        p = await this.update(ws, id, (cur) => {
          if (cur.status !== 'drafted' && cur.status !== 'verification_failed') throw invalid(cur, 'verify');
          return { ...cur, status: 'verifying', _through: 0, verifications: [...cur.verifications, { session, started_at: nowIso(), launched_at: null, source_version: body.expected_version, principal: body.principal, result: null }] };
        }, { expectedVersion: body.expected_version });
        crashPoint('skill-verification-recorded');
      } catch (err) {
        // The same request, arriving twice at once: the one that lost the race resumes the winner's attempt.
        const now = await this.load(ws, id);
        if (!(err instanceof ApiError) || !isRetry(now)) throw err;
        p = now;
      }
    }
    const attempt = p.verifications.at(-1);
    if (!attempt || attempt.result !== null) return p;
    // One launch at a time per attempt (a duplicate request in flight leaves it to the first).
    const lock = keys.scoped(tags.workspace(ws), `skill_verification_launch:${attempt.session}`);
    if ((await this.d.redis.set(lock, '1', 'PX', 60_000, 'NX')) !== 'OK') return p;
    try {
      await this.launch(p, attempt.session, attempt.principal);
    } catch (err) {
      // A spent budget or capacity passes (the attempt resumes on retry); a Session that can never
      // start (the Agent or the environment archived or gone) fails the attempt.
      if (!(err instanceof ApiError) || err.status >= 500 || err.status === 429) throw err;
      return this.update(ws, id, (cur) => {
        const a = cur.verifications.at(-1);
        if (cur.status !== 'verifying' || !a || a.session !== attempt.session || a.result !== null) return null;
        const result: VerificationResult = { verdict: 'failed', explanation: `the verification Session could not start: ${err.type}: ${err.message}`, cost_tokens: 0, completed_at: nowIso() };
        return { ...cur, status: 'verification_failed', verifications: [...cur.verifications.slice(0, -1), { ...a, result }] };
      });
    } finally {
      await this.d.redis.del(lock);
    }
    if (attempt.launched_at === null) {
      p = await this.update(ws, id, (cur) => {
        const a = cur.verifications.at(-1);
        if (!a || a.session !== attempt.session || a.launched_at !== null) return null;
        return { ...cur, verifications: [...cur.verifications.slice(0, -1), { ...a, launched_at: nowIso() }] };
      });
    }
    await this.enqueueWatch(ws, id, attempt.session);
    return p;
  }

  /**
   * The attempt's Session (its id reserved in the attempt) and its one drive, each made at most
   * once: the Session runs the proposal's Agent with the drafted skill placed beside its own, and
   * nothing of the source Sessions; `user.define_outcome` states the task and the rubric, graded
   * by the platform Outcome grader through the proposal's routing profile, one evaluation.
   */
  private async launch(p: SkillProposalDoc, sessionId: string, principal: string): Promise<void> {
    const skill: SpecSkill = { ref: p.id, name: p.skill?.name ?? 'skill', description: p.skill?.description ?? '', mount_path: `${SKILLS_DIR}/${p.skill?.name ?? 'skill'}` };
    await this.d.sessions.create(p.workspace_id, {
      agent: p.agent, environment_id: p._environment_id, title: `Verification of skill proposal ${p.id}`,
      metadata: { skill_proposal_id: p.id },
    }, undefined, { id: sessionId, skills: [skill] });
    // The drive is the Session's first client event: the head of its log tells whether it was made.
    const head = await this.d.sessions.store.log.range(sessionId, 0, 100);
    if (head.some((e) => e.type === 'user.define_outcome')) return;
    const session = await this.d.sessions.store.get(p.workspace_id, sessionId);
    await this.d.sessions.drive(session, {
      type: 'user.define_outcome',
      payload: {
        description: p.verification_material?.task ?? '', rubric: p.verification_material?.rubric ?? '', max_iterations: 1,
        grader_model: p.model_routing_profile_key, authored_by: principal, caused_by: { kind: 'api' },
      } as never,
    }, `skill-verification:${p.id}:${sessionId}`);
  }

  private async enqueueWatch(ws: string, id: string, sessionId: string, delay = 100): Promise<void> {
    await this.queue.add('watch', { workspace_id: ws, proposal_id: id, session_id: sessionId, polls: 0 } satisfies WatchJob, {
      jobId: `watch-${sessionId}`, delay, removeOnComplete: true, removeOnFail: { age: 24 * 3600 },
    });
  }

  /** The verdict of an attempt, from its Session's log: the outcome's end and its last evaluation. */
  private async verdictOf(sessionId: string, after: number): Promise<{ result: Omit<VerificationResult, 'cost_tokens' | 'completed_at'> | null; through: number }> {
    const state = await this.d.sessions.store.log.state(sessionId);
    if (state.erased) return { result: { verdict: 'failed', explanation: 'the verification Session was erased' }, through: after };
    let through = after;
    let evaluation: { result?: string; explanation?: string | null } | null = null;
    for (;;) {
      const batch: LogEvent[] = await this.d.sessions.store.log.range(sessionId, through, 500);
      if (batch.length === 0) return { result: null, through };
      for (const e of batch) {
        through = e.seq;
        const payload = (e.payload ?? {}) as Record<string, unknown>;
        if (e.type === 'session.outcome_evaluation_ended') evaluation = payload as { result?: string; explanation?: string | null };
        if (e.type === 'session.outcome_ended') {
          const outcome = String(payload.result ?? 'failed');
          const verdict = outcome === 'satisfied' ? 'satisfied' : (evaluation?.result && evaluation.result !== 'satisfied' ? evaluation.result : 'failed');
          const explanation = evaluation?.explanation ?? (typeof payload.reason === 'string' ? payload.reason : null);
          return { result: { verdict, explanation: explanation ?? null }, through };
        }
      }
    }
  }

  /**
   * Moves a `verifying` proposal to its verdict when the attempt's Session log has it (the
   * watcher and every read call this; the compare-and-swap makes one of them win).
   */
  async reconcile(ws: string, p: SkillProposalDoc): Promise<SkillProposalDoc> {
    if (p.status !== 'verifying') return p;
    const attempt = p.verifications.at(-1);
    if (!attempt || attempt.launched_at === null) return p;
    const { result, through } = await this.verdictOf(attempt.session, 0);
    if (!result) return p;
    const usage = await this.d.models.usage.read({ kind: 'session', session_id: attempt.session });
    const done: VerificationResult = { ...result, cost_tokens: usage.usage.total_tokens, completed_at: nowIso() };
    return this.update(ws, p.id, (cur) => {
      const a = cur.verifications.at(-1);
      if (cur.status !== 'verifying' || !a || a.session !== attempt.session || a.result !== null) return null;
      return {
        ...cur, status: done.verdict === 'satisfied' ? 'verified' : 'verification_failed', _through: through,
        verifications: [...cur.verifications.slice(0, -1), { ...a, result: done }],
      };
    }, { current: p });
  }

  private async watch(job: Job<WatchJob>, token: string | undefined): Promise<void> {
    const { workspace_id: ws, proposal_id: id } = job.data;
    const p = await this.d.docs.get<SkillProposalDoc>(tags.workspace(ws), id);
    if (!p || p.status !== 'verifying' || p.verifications.at(-1)?.session !== job.data.session_id) return;
    const after = await this.reconcile(ws, p);
    if (after.status !== 'verifying') return;
    const polls = (job.data.polls ?? 0) + 1;
    await job.updateData({ ...job.data, polls });
    await job.moveToDelayed(Date.now() + Math.min(WATCH_MAX_DELAY_MS, 100 * 2 ** Math.min(polls, 7)), token);
    throw new DelayedError();
  }

  /** An outcome ended in a verification Session: its watcher runs now instead of at its next poll. */
  private async nudge(t: TappedAppend): Promise<void> {
    if (!(await t.events()).some((e) => e.type === 'session.outcome_ended')) return;
    const job = await this.queue.getJob(`watch-${t.session_id}`);
    if (job && (await job.isDelayed())) await job.promote().catch(() => undefined);
  }

  async get(ws: string, id: string): Promise<SkillProposalDoc> {
    return this.reconcile(ws, await this.load(ws, id));
  }

  async list(ws: string, options: { limit: number; page?: string | undefined }) {
    return this.d.docs.list<SkillProposalDoc>(tags.workspace(ws), INDEX, { ...options, order: 'asc' });
  }

  /** The drafted skill's files, for the runtime route (verification Sessions only). */
  async draft(ws: string, id: string): Promise<SkillFile[]> {
    const p = await this.load(ws, id);
    if (p._content === undefined) throw new ApiError('validation.not_found', `skill proposal ${id} has no drafted skill`);
    return draftFiles(p);
  }

  // ---- discard -------------------------------------------------------------------------------

  async discard(ws: string, id: string, expectedVersion: number): Promise<SkillProposalDoc> {
    const p = await this.reconcile(ws, await this.load(ws, id));
    const allowed = new Set(['drafted', 'verified', 'verification_failed', 'authoring_failed']);
    if (!allowed.has(p.status)) throw invalid(p, 'discard');
    return this.update(ws, id, (cur) => {
      if (!allowed.has(cur.status)) throw invalid(cur, 'discard');
      return { ...cur, status: 'discarded' };
    }, { expectedVersion });
  }

  // ---- submission ----------------------------------------------------------------------------

  /**
   * From `verified` at `expected_version`: prepares the commit of the skill at
   * `<path>/<name>/` on the source's default branch, records it (`submission_attempt`, status
   * `submitting`), pushes it to `branch` only if that branch does not exist yet (or already holds
   * exactly the prepared commit), then `submitted`. `expected_base_digest`, when given, must
   * match the base: `git-sha1:`/`git-sha256:` the base commit, `sha256:` the content digest of
   * the skill's directory there (an absent directory digests as an empty one). A retry of the
   * same request resumes from the recorded attempt.
   */
  async submit(ws: string, id: string, body: { expected_version: number; skill_source: string; principal: string; branch?: string | undefined; expected_base_digest?: string | null | undefined }): Promise<SkillProposalDoc> {
    let p = await this.reconcile(ws, await this.load(ws, id));
    const pending = p.submission_attempt;
    const resuming = pending !== undefined && pending.source_version === body.expected_version && pending.skill_source === body.skill_source;
    if (resuming && p.status === 'submitted') return p;
    const source = await this.d.sources.get(ws, body.skill_source);
    const name = p.skill?.name ?? '';
    const dir = `${source.path}/${name}`;
    if (!resuming) {
      if (p.status !== 'verified') throw invalid(p, 'submit');
      if (p.version !== body.expected_version) throw new ApiError('validation.conflict', `expected_version ${body.expected_version} ${staleOrAhead(body.expected_version, p.version)}; the current version is ${p.version}`);
      // The submission is recorded as acted by this Principal (`acted_as`): one of this Workspace, active.
      await this.d.identity.activePrincipal(ws, body.principal, 'principal');
      const branch = body.branch ?? `skills/${name}-${id.slice(-8)}`;
      if (!isBranchName(branch) || branch === source.default_branch) throw new ApiError('validation.malformed', 'body.branch: a new branch name (not the default branch)');
      const remote = await this.d.sources.remote(source);
      const { scratch, head } = await Scratch.fetch(remote, source.default_branch);
      try {
        if (!head) throw new ApiError('validation.conflict', `the source has no branch '${source.default_branch}'`);
        const baseFiles = await scratch.readDir(head, dir);
        const baseDigest = baseFiles.length === 0 ? emptyDigest() : checkSkillFiles(baseFiles, 'base').digest;
        if (body.expected_base_digest) {
          const actual = body.expected_base_digest.startsWith('sha256:') ? baseDigest : `${head.length === 40 ? 'git-sha1' : 'git-sha256'}:${head}`;
          if (actual !== body.expected_base_digest) throw new ApiError('validation.conflict', `expected_base_digest does not match the base (${actual})`);
        }
        // The branch must be new: checked before anything is recorded (the push checks again).
        if ((await remoteHead(remote, branch)) !== null) throw new ApiError('validation.conflict', `branch '${branch}' already exists in the skill source`);
        const startedAt = nowIso();
        const prepared = await scratch.commit(head, dir, draftFiles(p), commitMessage(p), gitDate(startedAt));
        const attempt: SubmissionAttempt = {
          source_version: body.expected_version, skill_source: source.id, acted_as: body.principal, branch, base_commit_sha: head,
          base_content_sha256: baseDigest, expected_base_digest: body.expected_base_digest ?? null, prepared_commit_sha: prepared, started_at: startedAt,
        };
        p = await this.update(ws, id, (cur) => {
          if (cur.status !== 'verified') throw invalid(cur, 'submit');
          return { ...cur, status: 'submitting', submission_attempt: attempt };
        }, { expectedVersion: body.expected_version });
        try {
          await this.push(scratch, remote, attempt);
        } catch (err) {
          // Someone else took the branch meanwhile: nothing of ours is there, so the proposal goes back to verified.
          if (err instanceof ApiError && err.type === 'validation.conflict') {
            await this.update(ws, id, (cur) => {
              if (cur.status !== 'submitting' || cur.submission_attempt?.prepared_commit_sha !== attempt.prepared_commit_sha) return null;
              const { submission_attempt: _dropped, ...rest } = cur;
              return { ...rest, status: 'verified' };
            });
          }
          throw err;
        }
      } finally {
        await scratch.close();
      }
    } else if (p.status === 'submitting' && pending) {
      // Recovery: the recorded attempt is made again exactly (same base, content and dates, so the same commit).
      const remote = await this.d.sources.remote(source);
      const { scratch } = await Scratch.fetch(remote, source.default_branch);
      try {
        await scratch.fetchCommit(remote, pending.base_commit_sha);
        const again = await scratch.commit(pending.base_commit_sha, dir, draftFiles(p), commitMessage(p), gitDate(pending.started_at));
        if (again !== pending.prepared_commit_sha) throw new Error(`recovering submission of ${id}: the prepared commit could not be made again`);
        await this.push(scratch, remote, pending);
      } finally {
        await scratch.close();
      }
    } else {
      throw invalid(p, 'submit');
    }
    const attempt = p.submission_attempt as SubmissionAttempt;
    // The adoption watch is queued before the proposal is recorded submitted, so a process that
    // dies in between leaves it queued (it keeps polling while the proposal is still submitting).
    await this.enqueueAdopt(ws, id, this.d.adoptionPollMs);
    p = await this.update(ws, id, (cur) => cur.status !== 'submitting' ? null : {
      ...cur, status: 'submitted',
      submission: { skill_source: attempt.skill_source, branch: attempt.branch, commit_sha: attempt.prepared_commit_sha, submitted_at: nowIso() },
    });
    crashPoint('skill-proposal-submitted');
    return p;
  }

  /** Pushes the prepared commit unless the branch already holds it; a branch that moved elsewhere is a conflict. */
  private async push(scratch: Scratch, remote: GitRemote, a: SubmissionAttempt): Promise<void> {
    const current = await remoteHead(remote, a.branch);
    if (current === a.prepared_commit_sha) return;
    if (current !== null) throw new ApiError('validation.conflict', `branch '${a.branch}' of the skill source already exists at another commit`);
    try {
      await scratch.push(remote, a.prepared_commit_sha, a.branch, null);
    } catch (err) {
      // Refused or failed: what the branch holds now tells which.
      const now = await remoteHead(remote, a.branch).catch(() => null);
      if (now === a.prepared_commit_sha) return;
      if (now !== null) throw new ApiError('validation.conflict', `branch '${a.branch}' of the skill source was created at another commit while it was pushed`);
      throw err;
    }
  }

  // ---- adoption ------------------------------------------------------------------------------

  private async enqueueAdopt(ws: string, id: string, delay: number, polls = 0): Promise<void> {
    await this.queue.add('adopt', { workspace_id: ws, proposal_id: id, polls } satisfies AdoptJob, {
      jobId: `adopt-${id}-${polls}`, delay, removeOnComplete: true, removeOnFail: { age: 24 * 3600 },
    });
  }

  /**
   * Checks a submitted proposal's source: when its default branch holds the skill's directory
   * with exactly the submitted content, that content becomes a version of the Workspace's Skill
   * of that name (or the latest version already holding it) and the proposal records `adoption`.
   * True when adopted (now or before).
   */
  async observeAdoption(ws: string, id: string): Promise<boolean> {
    const p = await this.load(ws, id);
    if (p.status !== 'submitted' || !p.submission || !p.skill) return false;
    if (p.adoption) return true;
    const source = await this.d.sources.get(ws, p.submission.skill_source);
    const { scratch, head } = await Scratch.fetch(await this.d.sources.remote(source), source.default_branch);
    let files: SkillFile[];
    try {
      if (!head) return false;
      files = await scratch.readDir(head, `${source.path}/${p.skill.name}`);
    } finally {
      await scratch.close();
    }
    if (files.length === 0) return false;
    let digest: string;
    try {
      digest = checkSkillFiles(files, 'source').digest;
    } catch {
      return false;
    }
    if (digest !== p.skill.content_sha256) return false;
    // Published once per proposal, and never as a copy of the latest version: both settled by the
    // skill's append script, so concurrent syncs and the adopt job publish one version between them.
    const adopted = await this.d.skills.publish(ws, files, 'source', 'source', { claim: p.id });
    await this.update(ws, id, (cur) => cur.status !== 'submitted' || cur.adoption ? null : {
      ...cur, adoption: { skill_id: adopted.skill.id, skill_version: adopted.version.version, observed_at: nowIso() },
    });
    return true;
  }

  /** Every submitted, not yet adopted proposal of the source, checked now. */
  async syncSource(ws: string, sourceId: string): Promise<string[]> {
    await this.d.sources.get(ws, sourceId);
    const adopted: string[] = [];
    let page: string | undefined;
    do {
      const batch = await this.list(ws, { limit: 100, page });
      for (const p of batch.data) {
        if (p.status === 'submitted' && !p.adoption && p.submission?.skill_source === sourceId && (await this.observeAdoption(ws, p.id))) adopted.push(p.id);
      }
      page = batch.next_page ?? undefined;
    } while (page);
    return adopted;
  }

  private async adopt(job: Job<AdoptJob>): Promise<void> {
    const { workspace_id: ws, proposal_id: id } = job.data;
    const polls = job.data.polls ?? 0;
    let done = false;
    try {
      done = await this.observeAdoption(ws, id);
    } catch (err) {
      this.d.log.warn({ proposal: id, err: (err as Error).message }, 'checking a skill source for adoption failed');
    }
    const p = await this.d.docs.get<SkillProposalDoc>(tags.workspace(ws), id);
    // A week of polls at most; `POST /v1/skill-sources/{id}/sync` checks at any time. A proposal
    // still submitting is one whose push is being made or recovered: it is watched on.
    if (!done && (p?.status === 'submitted' || p?.status === 'submitting') && polls * this.d.adoptionPollMs < 7 * 24 * 3600_000) await this.enqueueAdopt(ws, id, this.d.adoptionPollMs, polls + 1);
  }

  // ---- sweep ---------------------------------------------------------------------------------

  /**
   * Work a crash may have lost: an `authoring` proposal gets its job again (same job id, so
   * never twice at once), a `verifying` one resumes its attempt exactly as a retried verify
   * would (the reserved Session, created and driven at most once, and its watcher).
   */
  async sweep(): Promise<void> {
    const members = await this.d.redis.zrangebyscore(OUTBOX, '-inf', Date.now() - 5000, 'LIMIT', 0, 100);
    for (const m of members) {
      const [ws, id] = m.split('/');
      if (!ws || !id) continue;
      const p = await this.d.docs.get<SkillProposalDoc>(tags.workspace(ws), id);
      if (!p || (p.status !== 'authoring' && p.status !== 'verifying')) {
        await this.d.redis.zrem(OUTBOX, m);
        continue;
      }
      await this.d.redis.zadd(OUTBOX, Date.now(), m);
      try {
        if (p.status === 'authoring') {
          await this.queueAuthoring(ws, id);
        } else {
          const a = p.verifications.at(-1);
          if (a) await this.verify(ws, id, { expected_version: a.source_version, principal: a.principal });
        }
      } catch (err) {
        this.d.log.warn({ proposal: id, err: (err as Error).message }, 'resuming skill proposal work failed');
      }
    }
  }

  // ---- worker --------------------------------------------------------------------------------

  start(): void {
    const worker = this.host.startWorker(async (job: Job, token?: string) => {
      if (job.name === 'author') return this.author(job as Job<AuthorJob>);
      if (job.name === 'watch') return this.watch(job as Job<WatchJob>, token);
      if (job.name === 'adopt') return this.adopt(job as Job<AdoptJob>);
    }, { concurrency: 8 });
    if (!worker) return;
    worker.on('failed', (job, err) => {
      if (!job || job.name !== 'author' || job.attemptsMade < AUTHOR_ATTEMPTS) return;
      const data = job.data as AuthorJob;
      this.d.log.warn({ proposal: data.proposal_id, err: err.message }, 'skill authoring failed');
      void this.failAuthoring(data.workspace_id, data.proposal_id, 'internal').catch((e: unknown) => this.d.log.error({ err: e }, 'recording failed authoring failed'));
    });
    this.d.tap.on({ wants: () => true, types: ['session.outcome_ended'] }, (t) => this.nudge(t));
    this.host.sweepEvery(SWEEP_MS, () => this.sweep(), 'skill proposal sweep failed');
  }

  close(): Promise<void> {
    return this.host.close();
  }
}

const emptyDigest = () => `sha256:${createHash('sha256').update('').digest('hex')}`;
const gitDate = (iso: string) => `${Math.floor(Date.parse(iso) / 1000)} +0000`;
const commitMessage = (p: SkillProposalDoc) => `Add skill ${p.skill?.name ?? ''}\n\n${p.skill?.description ?? ''}\n\nSkill-Proposal: ${p.id}\nContent-Sha256: ${p.skill?.content_sha256 ?? ''}\n`;
