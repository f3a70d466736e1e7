import { ok } from '../api';
import type { Ctx } from '../main';
import { Badge, ErrorBanner, fmtMs, fmtTime, Json, Section, useAsync } from '../ui';

interface Attempt { attempt: number; runner_id: string; leased_at: string; ended_at: string | null; outcome: string | null; cause: string | null; lease_id?: string }
interface RunDoc {
  id: string; session_id: string; session_thread_id: string; status: string; runner_pool_id?: string | null;
  attempts?: Attempt[]; timestamps?: Record<string, string | null>; waiting_reason?: string | null; stop_reason?: unknown;
  failure?: { class: string; code: string; message: string } | null;
}

/** The phases a Run passes through, in order, named by their timestamp fields. */
export const PHASES: { key: string; label: string }[] = [
  { key: 'accepted_at', label: 'Accepted' },
  { key: 'enqueued_at', label: 'Enqueued' },
  { key: 'leased_at', label: 'Leased' },
  { key: 'started_at', label: 'Started' },
  { key: 'first_event_at', label: 'First event' },
  { key: 'ended_at', label: 'Ended' },
];

/** A Run id as the API writes it: a page for anything else (`..` would leave /v1/runs/) asks the API nothing. */
const RUN_ID = /^run_[0-9a-f]{32}$/;

export function RunPage({ ctx, id }: { ctx: Ctx; id: string }) {
  const run = useAsync(async () => {
    if (!RUN_ID.test(id)) throw new Error(`'${id}' is not a Run id (run_ and 32 hex digits)`);
    return (await ok(ctx.api.GET('/v1/runs/{run_id}', { params: { path: { run_id: id } } }))) as unknown as RunDoc;
  }, [id]);
  const r = run.data;
  const ts = r?.timestamps ?? {};
  const points = PHASES.map((p) => ({ ...p, at: ts[p.key] ? Date.parse(ts[p.key] as string) : null }));
  const known = points.filter((p) => p.at !== null) as { key: string; label: string; at: number }[];
  const t0 = known[0]?.at ?? 0;
  const total = Math.max(1, (known[known.length - 1]?.at ?? t0) - t0);
  return (
    <>
      <div class="page-head">
        <div>
          <h1>Run</h1>
          <div class="muted mono small">{id}</div>
        </div>
        {r ? <a href={`#/sessions/${r.session_id}`}>Back to session</a> : null}
      </div>
      <ErrorBanner error={run.error} />
      {r ? (
        <>
          <Section title="Timeline">
            <p><Badge value={r.status} /> {r.waiting_reason ? <span class="muted">waiting: {r.waiting_reason}</span> : null}</p>
            <ol class="timeline" aria-label="Run phases">
              {points.map((p, i) => {
                const next = points.slice(i + 1).find((q) => q.at !== null);
                const span = p.at !== null && next?.at != null ? next.at - p.at : null;
                return (
                  <li key={p.key} data-phase={p.key} class={p.at === null ? 'pending' : ''}>
                    <span class="phase">{p.label}</span>
                    <span class="bar-track" aria-hidden="true">
                      {p.at !== null ? (
                        <svg class="bar" viewBox="0 0 1000 10" preserveAspectRatio="none" role="presentation">
                          <rect x={((p.at - t0) / total) * 1000} y="0" width={Math.max(4, ((span ?? 0) / total) * 1000)} height="10" />
                        </svg>
                      ) : null}
                    </span>
                    <span class="when">{p.at !== null ? `${fmtTime(ts[p.key])}${span !== null ? ` · +${fmtMs(span)}` : ''}` : '—'}</span>
                  </li>
                );
              })}
            </ol>
            {known.length > 1 ? <p class="muted">Accepted to {known[known.length - 1]?.label.toLowerCase()}: {fmtMs(total)}</p> : null}
          </Section>
          <Section title="Attempts">
            <div class="table-wrap">
              <table class="list" aria-label="Attempts">
                <thead><tr><th scope="col">#</th><th scope="col">Runner</th><th scope="col">Leased</th><th scope="col">Ended</th><th scope="col">Outcome</th><th scope="col">Cause</th></tr></thead>
                <tbody>
                  {(r.attempts ?? []).map((a) => (
                    <tr key={a.attempt}><td>{a.attempt}</td><td class="mono small">{a.runner_id}</td><td>{fmtTime(a.leased_at)}</td><td>{fmtTime(a.ended_at)}</td><td><Badge value={a.outcome ?? 'running'} /></td><td>{a.cause ?? '—'}</td></tr>
                  ))}
                  {(r.attempts ?? []).length === 0 ? <tr><td colSpan={6} class="muted">Not leased yet.</td></tr> : null}
                </tbody>
              </table>
            </div>
          </Section>
          {r.failure || r.stop_reason ? (
            <Section title="Outcome">
              <Json value={{ stop_reason: r.stop_reason ?? null, failure: r.failure ?? null }} />
            </Section>
          ) : null}
        </>
      ) : null}
    </>
  );
}
