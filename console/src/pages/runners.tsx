import { useEffect, useState } from 'preact/hooks';
import { describeError, everyPage, idempotencyKey, ok, type ListPage } from '../api';
import type { Ctx } from '../main';
import { Badge, ErrorBanner, fmtAgo, fmtTime, Section, useAsync, useTicker } from '../ui';

interface Pool { id: string; name: string; placement: string; is_default: boolean; status: string; drain: { deadline: string; reason: string } | null }
interface Presence {
  runner: string; runner_pool: string; status: string; placement: string; capabilities: Record<string, unknown>;
  last_seen_at: string; expires_at: string; owner?: { principal: string; machine_label: string };
}
interface Principal { id: string; display_name?: string | null; external_subject_id?: string }

const PRESENCE_POLL_MS = 2000;

export function RunnersPage({ ctx }: { ctx: Ctx }) {
  const pools = useAsync(() => everyPage(async (page) => (await ok(ctx.api.GET('/v1/runner-pools', { params: { query: { limit: 100, ...(page ? { page } : {}) } } }))) as ListPage<Pool>), []);
  const [presences, setPresences] = useState<Presence[] | null>(null);
  const [presenceError, setPresenceError] = useState<string | null>(null);
  const [actionError, setActionError] = useState<string | null>(null);
  const now = useTicker(1000);

  // Presences are a short-TTL projection: poll it so heartbeats show live.
  useEffect(() => {
    let stop = false;
    let timer: ReturnType<typeof setTimeout> | undefined;
    const tick = async () => {
      try {
        const r = (await ok(ctx.api.GET('/v1/runner-pools/presences'))) as { data: Presence[] };
        if (!stop) { setPresences(r.data); setPresenceError(null); }
      } catch (err) {
        if (!stop) setPresenceError(describeError(err));
      }
      if (!stop) timer = setTimeout(() => void tick(), PRESENCE_POLL_MS);
    };
    void tick();
    return () => { stop = true; clearTimeout(timer); };
  }, [ctx.api]);

  async function act(what: () => Promise<unknown>) {
    setActionError(null);
    try {
      await what();
      pools.reload();
    } catch (err) {
      setActionError(describeError(err));
    }
  }
  const drainPool = (id: string) => act(() => ok(ctx.api.POST('/v1/runner-pools/{runner_pool_id}/drain', { params: { path: { runner_pool_id: id } }, body: { reason: 'drained from the console' } })));
  const resumePool = (id: string) => act(() => ok(ctx.api.POST('/v1/runner-pools/{runner_pool_id}/resume', { params: { path: { runner_pool_id: id } } })));
  const drainRunner = (id: string) => act(() => ok(ctx.api.POST('/v1/runners/{runner_id}/drain', { params: { path: { runner_id: id } }, body: { reason: 'drained from the console' } })));
  const resumeRunner = (id: string) => act(() => ok(ctx.api.POST('/v1/runners/{runner_id}/resume', { params: { path: { runner_id: id } } })));

  return (
    <>
      <div class="page-head"><h1>Runners</h1></div>
      <ErrorBanner error={actionError} />
      <Section title="Pools">
        <ErrorBanner error={pools.error} />
        <div class="table-wrap">
          <table class="list" aria-label="Runner pools">
            <thead><tr><th scope="col">Pool</th><th scope="col">Placement</th><th scope="col">Status</th><th scope="col">Drain</th><th scope="col"><span class="sr-only">Actions</span></th></tr></thead>
            <tbody>
              {(pools.data ?? []).map((p) => (
                <tr key={p.id} data-pool-id={p.id}>
                  <td>{p.name}{p.is_default ? <span class="muted"> (default)</span> : null}<div class="muted mono small">{p.id}</div></td>
                  <td>{p.placement}</td>
                  <td><Badge value={p.status} /></td>
                  <td>{p.drain ? `${p.drain.reason}, until ${fmtTime(p.drain.deadline)}` : '—'}</td>
                  <td class="actions">
                    {p.status === 'draining'
                      ? <button type="button" onClick={() => void resumePool(p.id)} aria-label={`Resume pool ${p.name}`}>Resume</button>
                      : <button type="button" onClick={() => void drainPool(p.id)} aria-label={`Drain pool ${p.name}`}>Drain</button>}
                  </td>
                </tr>
              ))}
            </tbody>
          </table>
        </div>
      </Section>
      <Section title="Runners" actions={<span class="muted small">live · every {PRESENCE_POLL_MS / 1000}s</span>}>
        <ErrorBanner error={presenceError} />
        <div class="table-wrap">
          <table class="list" aria-label="Runner presences">
            <thead><tr><th scope="col">Runner</th><th scope="col">Pool</th><th scope="col">Status</th><th scope="col">Owner</th><th scope="col">Capabilities</th><th scope="col">Last heartbeat</th><th scope="col"><span class="sr-only">Actions</span></th></tr></thead>
            <tbody>
              {(presences ?? []).map((r) => (
                <tr key={r.runner} data-runner-id={r.runner}>
                  <td class="mono small">{r.runner}</td>
                  <td class="mono small">{r.runner_pool}</td>
                  <td><Badge value={r.status} /></td>
                  <td>{r.owner ? `${r.owner.machine_label} (${r.owner.principal.slice(0, 12)}…)` : <span class="muted">{r.placement === 'managed' ? 'managed' : 'no owner'}</span>}</td>
                  <td><Capabilities caps={r.capabilities} /></td>
                  <td data-last-seen={r.last_seen_at}>{fmtAgo(r.last_seen_at, now)}</td>
                  <td class="actions">{r.status !== 'draining'
                    ? <button type="button" onClick={() => void drainRunner(r.runner)} aria-label={`Drain runner ${r.runner}`}>Drain</button>
                    : <button type="button" onClick={() => void resumeRunner(r.runner)} aria-label={`Resume runner ${r.runner}`}>Resume</button>}</td>
                </tr>
              ))}
              {presences && presences.length === 0 ? <tr><td colSpan={7} class="muted">No runner is connected.</td></tr> : null}
            </tbody>
          </table>
        </div>
      </Section>
      <Pairing ctx={ctx} />
    </>
  );
}

function Capabilities({ caps }: { caps: Record<string, unknown> }) {
  const entries = Object.entries(caps);
  if (entries.length === 0) return <span class="muted">—</span>;
  return (
    <details>
      <summary>{entries.length} capabilities</summary>
      <dl class="kv small">{entries.flatMap(([k, v]) => [<dt key={`k-${k}`}>{k}</dt>, <dd key={`v-${k}`} class="mono">{typeof v === 'string' ? v : JSON.stringify(v)}</dd>])}</dl>
    </details>
  );
}

function Pairing({ ctx }: { ctx: Ctx }) {
  const principals = useAsync(() => everyPage(async (page) => (await ok(ctx.api.GET('/v1/organizations/workspaces/{workspace_id}/principals', { params: { path: { workspace_id: ctx.workspaceId }, query: { limit: 100, ...(page ? { page } : {}) } } }))) as ListPage<Principal>), [ctx.workspaceId]);
  const [principal, setPrincipal] = useState('');
  const [label, setLabel] = useState('');
  const [minutes, setMinutes] = useState(10);
  const [issued, setIssued] = useState<{ code: string; expires_at: string } | null>(null);
  const [error, setError] = useState<string | null>(null);
  const [busy, setBusy] = useState(false);
  const who = principal || principals.data?.[0]?.id || '';

  async function create(e: Event) {
    e.preventDefault();
    setBusy(true);
    setError(null);
    setIssued(null);
    try {
      const r = (await ok(ctx.api.POST('/v1/runner-pairings', {
        params: { header: { 'Idempotency-Key': idempotencyKey() } },
        body: { principal_id: who, machine_label: label.trim(), expires_in_seconds: minutes * 60 },
      }))) as { code: string; expires_at: string };
      setIssued(r);
    } catch (err) {
      setError(describeError(err));
    } finally {
      setBusy(false);
    }
  }
  const command = issued ? `node runner-daemon/dist/cli.js pair --code ${issued.code} --url ${location.origin}` : '';
  return (
    <Section title="Pair a machine">
      <form class="filters" onSubmit={create}>
        <div class="field">
          <label for="pair-principal">Owner (Principal)</label>
          {principals.data ? (
            <select id="pair-principal" value={who} onChange={(e) => setPrincipal(e.currentTarget.value)}>
              {principals.data.map((p) => <option key={p.id} value={p.id}>{p.display_name || p.external_subject_id || p.id}</option>)}
            </select>
          ) : <input id="pair-principal" class="mono" placeholder="prin_…" value={principal} onInput={(e) => setPrincipal(e.currentTarget.value)} />}
        </div>
        <div class="field">
          <label for="pair-label">Machine label</label>
          <input id="pair-label" required maxLength={200} value={label} onInput={(e) => setLabel(e.currentTarget.value)} />
        </div>
        <div class="field">
          <label for="pair-minutes">Expires in (minutes)</label>
          <input id="pair-minutes" type="number" min={2} max={10} value={minutes} onInput={(e) => setMinutes(Number(e.currentTarget.value) || 10)} />
        </div>
        <button type="submit" class="primary" disabled={busy || !who || !label.trim()}>Create pairing code</button>
      </form>
      <ErrorBanner error={error ?? principals.error} />
      {issued ? (
        <div class="issued" role="status">
          <p>Pairing code (shown once, expires {fmtTime(issued.expires_at)}):</p>
          <p class="code-big mono" data-pairing-code={issued.code}>{issued.code}</p>
          <p>On the machine to pair, run:</p>
          <pre class="code" tabIndex={0}><code data-pair-command>{command}</code></pre>
          <p class="muted small">then <code>node runner-daemon/dist/cli.js start</code>.</p>
        </div>
      ) : null}
    </Section>
  );
}
