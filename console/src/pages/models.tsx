import { everyPage, ok } from '../api';
import type { Ctx } from '../main';
import { Badge, ErrorBanner, fmtTime, fmtUsd, Section, useAsync } from '../ui';

interface Day { date: string; tokens: number; cost: number; steps: number }

/** Workspace tokens per UTC day (the last 30 days, oldest first) as an SVG bar chart. */
function UsageChart({ days }: { days: Day[] }) {
  const max = Math.max(1, ...days.map((d) => d.tokens));
  const total = days.reduce((n, d) => n + d.tokens, 0);
  const w = 640;
  const h = 160;
  const bw = w / Math.max(1, days.length);
  return (
    <figure class="chart">
      <svg viewBox={`0 0 ${w} ${h + 20}`} role="img" aria-label={`Tokens per day over the last ${days.length} days: ${total} in all`}>
        <line x1="0" y1={h} x2={w} y2={h} class="axis" />
        {days.map((d, i) => {
          const bh = d.tokens > 0 ? Math.max(2, (d.tokens / max) * (h - 10)) : 0;
          return (
            <rect key={d.date} x={i * bw + bw * 0.15} y={h - bh} width={bw * 0.7} height={bh} class="bar-fill" data-date={d.date}>
              <title>{`${d.date}: ${d.tokens} tokens in ${d.steps} model steps, ${fmtUsd(d.cost)}`}</title>
            </rect>
          );
        })}
        <text x="0" y={h + 16} class="tick">{days[0]?.date}</text>
        <text x={w} y={h + 16} class="tick" text-anchor="end">{days[days.length - 1]?.date}</text>
      </svg>
      <figcaption class="muted small">Total tokens per UTC day (max {max}){total === 0 ? '; no model steps in this period' : ''}.</figcaption>
    </figure>
  );
}

export function ModelsPage({ ctx }: { ctx: Ctx }) {
  const ws = ctx.workspaceId;
  const path = { params: { path: { workspace_id: ws } } };
  // Every page of each list (a list's default page is 20 items): a workspace's credentials and
  // profiles are few, and one left off would look as if it did not exist.
  const creds = useAsync(() => everyPage(async (page) => ok(ctx.api.GET('/v1/organizations/workspaces/{workspace_id}/model-credentials', {
    params: { path: { workspace_id: ws }, query: { limit: 100, ...(page ? { page } : {}) } },
  }))), [ws]);
  const profiles = useAsync(() => everyPage(async (page) => ok(ctx.api.GET('/v1/organizations/workspaces/{workspace_id}/model-routing-profiles', {
    params: { path: { workspace_id: ws }, query: { limit: 100, ...(page ? { page } : {}) } },
  }))), [ws]);
  const usage = useAsync(async () => ok(ctx.api.GET('/v1/organizations/workspaces/{workspace_id}/usage', path)), [ws]);
  const series = useAsync(async () => {
    const r = await ok(ctx.api.GET('/v1/organizations/workspaces/{workspace_id}/usage/daily', { params: { path: { workspace_id: ws }, query: { days: 30 } } }));
    return r.days.map((d): Day => ({ date: d.date, tokens: d.summary.usage.total_tokens, cost: d.summary.list_cost.amount, steps: d.summary.steps }));
  }, [ws]);

  const u = usage.data;
  return (
    <>
      <div class="page-head"><h1>Models</h1></div>
      <div class="grid2">
        <Section title="Usage">
          <ErrorBanner error={usage.error} />
          {u ? (
            <dl class="kv">
              <dt>Today</dt><dd>{u.current_day.summary.usage.total_tokens} tokens · {fmtUsd(u.current_day.summary.list_cost.amount)}</dd>
              <dt>This month</dt><dd>{u.current_month.summary.usage.total_tokens} tokens · {fmtUsd(u.current_month.summary.list_cost.amount)}</dd>
              <dt>All time</dt><dd>{u.total.usage.total_tokens} tokens · {fmtUsd(u.total.list_cost.amount)} · {u.total.steps} steps</dd>
            </dl>
          ) : null}
        </Section>
        <Section title="Budget">
          {u?.budget ? (
            <dl class="kv">
              <dt>Limit</dt><dd>{fmtUsd(u.budget.max_list_cost.amount)} per {u.budget.period}</dd>
              <dt>Spent</dt><dd>{fmtUsd(u.budget.period === 'day' ? u.current_day.summary.list_cost.amount : u.budget.period === 'month' ? u.current_month.summary.list_cost.amount : u.total.list_cost.amount)}</dd>
            </dl>
          ) : <p class="muted">No workspace budget is set.</p>}
        </Section>
      </div>
      <Section title="Usage over time">
        <ErrorBanner error={series.error} />
        {series.data ? <UsageChart days={series.data} /> : null}
      </Section>
      <Section title="Credentials">
        <ErrorBanner error={creds.error} />
        <div class="table-wrap">
          <table class="list" aria-label="Model credentials">
            <thead><tr><th scope="col">Key</th><th scope="col">Provider</th><th scope="col">Status</th><th scope="col">Health</th><th scope="col">Generation</th><th scope="col">Updated</th></tr></thead>
            <tbody>
              {(creds.data ?? []).map((c) => (
                <tr key={c.id}><td>{c.display_name}<div class="muted mono small">{c.key}</div></td><td>{c.provider_key}</td><td><Badge value={c.status} /></td><td><Badge value={c.health_status} /></td><td>{c.active_generation_number}</td><td>{fmtTime(c.updated_at)}</td></tr>
              ))}
              {creds.data && creds.data.length === 0 ? <tr><td colSpan={6} class="muted">No model credentials (the built-in scripted model needs none).</td></tr> : null}
            </tbody>
          </table>
        </div>
      </Section>
      <Section title="Routing profiles">
        <ErrorBanner error={profiles.error} />
        <div class="table-wrap">
          <table class="list" aria-label="Routing profiles">
            <thead><tr><th scope="col">Profile</th><th scope="col">Revision</th><th scope="col">Candidates (in order)</th></tr></thead>
            <tbody>
              {(profiles.data ?? []).map((p) => (
                <tr key={p.id}><td>{p.display_name}<div class="muted mono small">{p.key}</div></td><td>{p.latest_revision_number}</td>
                  <td><ol class="plain">{p.candidates.map((c, i) => <li key={i}><span class="mono">{c.credential_key}</span> → {c.provider_model}</li>)}</ol></td></tr>
              ))}
              {profiles.data && profiles.data.length === 0 ? <tr><td colSpan={3} class="muted">No routing profiles.</td></tr> : null}
            </tbody>
          </table>
        </div>
      </Section>
    </>
  );
}
