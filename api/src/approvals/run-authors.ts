import { tags, type LogEvent } from '@agentplane/store';
import type { OutcomeDoc, SessionStore } from '@agentplane/domain';

const MAX_CACHED = 10_000;
/** How far back the log is read for a Run's input messages (they precede the Run's own events). */
const MAX_SCANNED = 200_000;
const MAX_HOPS = 1000;

/**
 * The Principals a Run acts for: the `authored_by` of the user messages that started its turn
 * (a continuation Run, started by answered waits, acts for the Run it continues; an outcome's
 * revision turn, started by the grader's verdict, acts for the Principal who defined the
 * outcome: its `user.define_outcome`'s author). Principal-scoped
 * ActionPolicies match tool uses of the Run for these Principals. Cached per Run that took the
 * inputs (a Run's inputs never change; its continuations share the entry). Throws when an input
 * message cannot be found (the caller fails closed).
 */
export class RunAuthors {
  private readonly cache = new Map<string, string[]>();

  constructor(private readonly store: SessionStore) {}

  async of(sessionId: string, runId: string): Promise<string[]> {
    const direct = this.cache.get(runId);
    if (direct) return direct;
    let run = await this.store.run(sessionId, runId);
    for (let hops = 0; run && run.input_event_ids.length === 0 && run.continues_run_id && hops < MAX_HOPS; hops++) {
      const hit = this.cache.get(run.continues_run_id);
      if (hit) return hit;
      run = await this.store.run(sessionId, run.continues_run_id);
    }
    if (!run) throw new Error(`run ${runId} not found`);
    if (run.input_event_ids.length === 0 && run.continues_run_id) throw new Error(`run ${runId} continues a chain longer than ${MAX_HOPS} Runs`);
    const root = run.id;
    const wanted = new Set(run.input_event_ids);
    const authors = new Set<string>();
    let before: number | null = null;
    for (let scanned = 0; wanted.size > 0 && scanned < MAX_SCANNED;) {
      const page: LogEvent[] = await this.store.log.rangeBackward(sessionId, before, 500);
      if (page.length === 0) break;
      // An input may name another event to read the author from (an outcome's define), which
      // may be in this page too: the page is gone through until it names nothing new.
      for (let named = true; named;) {
        named = false;
        for (const e of page) {
          if (!wanted.delete(e.id)) continue;
          const payload = e.payload as { authored_by?: unknown; outcome_id?: unknown } | null;
          if (typeof payload?.authored_by === 'string') authors.add(payload.authored_by);
          else if (e.type.startsWith('session.outcome_') && typeof payload?.outcome_id === 'string') {
            const outcome = await this.store.docs.get<OutcomeDoc>(tags.session(sessionId), payload.outcome_id);
            if (!outcome) throw new Error(`outcome ${payload.outcome_id} of run ${root}'s input was not found`);
            wanted.add(outcome.define_event_id);
            named = true;
          }
        }
      }
      scanned += page.length;
      before = Math.min(...page.map((e) => e.seq));
    }
    if (wanted.size > 0) throw new Error(`${wanted.size} input message(s) of run ${root} were not found in the log`);
    const out = [...authors].sort();
    if (this.cache.size >= MAX_CACHED) this.cache.delete(this.cache.keys().next().value as string);
    this.cache.set(root, out);
    return out;
  }
}
