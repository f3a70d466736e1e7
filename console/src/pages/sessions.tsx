import { useEffect, useRef, useState } from 'preact/hooks';
import { describeError, everyPage, idempotencyKey, ok, type ListPage } from '../api';
import type { Ctx } from '../main';
import { Badge, ErrorBanner, fmtTime, Section, useAsync } from '../ui';

export interface SessionView {
  id: string;
  title: string | null;
  status?: string;
  agent?: { id?: string; name?: string; model?: unknown };
  environment_id?: string;
  automation_id?: string;
  archived_at: string | null;
  created_at: string;
  updated_at: string;
  usage?: { input_tokens?: number; output_tokens?: number };
  /** `last_event_at`: the newest event in its log (a turn changes it; the Session's own fields, `updated_at`, are not rewritten per turn). */
  stats?: { last_event_at?: string | null };
}

interface Named { id: string; name: string }

const STATUSES = ['', 'idle', 'running', 'rescheduling', 'terminated'];

export function SessionsPage({ ctx }: { ctx: Ctx }) {
  const [agent, setAgent] = useState('');
  const [automation, setAutomation] = useState('');
  const [status, setStatus] = useState('');
  const [archived, setArchived] = useState(false);
  const [creating, setCreating] = useState(false);

  const agents = useAsync(() => everyPage(async (page) => (await ok(ctx.api.GET('/v1/agents', { params: { query: { limit: 100, ...(page ? { page } : {}) } } }))) as ListPage<Named>), []);
  const query = (page?: string): Record<string, string | number | boolean> => {
    const q: Record<string, string | number | boolean> = { limit: 100, order: 'desc' };
    if (agent) q.agent_id = agent;
    if (automation.trim()) q.automation_id = automation.trim();
    if (archived) q.include_archived = true;
    if (page) q.page = page;
    return q;
  };
  const list = useAsync(async () => (await ok(ctx.api.GET('/v1/sessions', { params: { query: query() } }))) as unknown as ListPage<SessionView>, [agent, automation, archived]);
  // Older pages, read on demand after the first (they go when the first page is read again).
  const [older, setOlder] = useState<{ rows: SessionView[]; next: string | null }>({ rows: [], next: null });
  const [olderError, setOlderError] = useState<string | null>(null);
  const [loadingOlder, setLoadingOlder] = useState(false);
  const first = useRef(list.data);
  useEffect(() => {
    first.current = list.data;
    setOlder({ rows: [], next: list.data?.next_page ?? null });
    setOlderError(null);
  }, [list.data]);
  async function showOlder() {
    const from = first.current;
    setLoadingOlder(true);
    try {
      const page = (await ok(ctx.api.GET('/v1/sessions', { params: { query: query(older.next ?? undefined) } }))) as unknown as ListPage<SessionView>;
      // A page of a list read again since is dropped.
      if (first.current === from) setOlder((o) => ({ rows: [...o.rows, ...page.data], next: page.next_page ?? null }));
    } catch (err) {
      setOlderError(describeError(err));
    } finally {
      setLoadingOlder(false);
    }
  }

  const rows = [...(list.data?.data ?? []), ...older.rows].filter((s) => !status || s.status === status);

  return (
    <>
      <div class="page-head">
        <h1>Sessions</h1>
        <button type="button" class="primary" onClick={() => setCreating((c) => !c)} aria-expanded={creating}>New session</button>
      </div>
      {creating ? <NewSession ctx={ctx} agents={agents.data ?? []} /> : null}
      <Section title="Filters">
        <form class="filters" onSubmit={(e) => e.preventDefault()}>
          <div class="field">
            <label for="f-agent">Agent</label>
            <select id="f-agent" value={agent} onChange={(e) => setAgent(e.currentTarget.value)}>
              <option value="">Any agent</option>
              {(agents.data ?? []).map((a) => <option key={a.id} value={a.id}>{a.name}</option>)}
            </select>
          </div>
          <div class="field">
            <label for="f-status">Status</label>
            <select id="f-status" value={status} onChange={(e) => setStatus(e.currentTarget.value)}>
              {STATUSES.map((s) => <option key={s} value={s}>{s || 'Any status'}</option>)}
            </select>
          </div>
          <div class="field">
            <label for="f-automation">Automation id</label>
            <input id="f-automation" value={automation} placeholder="auto_…" onChange={(e) => setAutomation(e.currentTarget.value)} />
          </div>
          <div class="field check">
            <input id="f-archived" type="checkbox" checked={archived} onChange={(e) => setArchived(e.currentTarget.checked)} />
            <label for="f-archived">Include archived</label>
          </div>
          <button type="button" onClick={list.reload}>Refresh</button>
        </form>
      </Section>
      <ErrorBanner error={list.error ?? olderError} />
      <div class="table-wrap">
        <table class="list" aria-label="Sessions" aria-busy={list.loading}>
          <thead><tr><th scope="col">Session</th><th scope="col">Agent</th><th scope="col">Status</th><th scope="col">Created</th><th scope="col">Last activity</th></tr></thead>
          <tbody>
            {rows.map((s) => (
              <tr key={s.id} data-session-id={s.id}>
                <td><a href={`#/sessions/${s.id}`}>{s.title || s.id}</a>{s.title ? <div class="muted mono small">{s.id}</div> : null}</td>
                <td>{s.agent?.name ?? '—'}</td>
                <td><Badge value={s.archived_at ? 'archived' : s.status} /></td>
                <td>{fmtTime(s.created_at)}</td>
                <td>{fmtTime(s.stats?.last_event_at ?? s.updated_at)}</td>
              </tr>
            ))}
            {!list.loading && rows.length === 0 ? <tr><td colSpan={5} class="muted">No sessions match.</td></tr> : null}
          </tbody>
        </table>
      </div>
      {older.next ? <button type="button" onClick={() => void showOlder()} disabled={loadingOlder}>Show older sessions</button> : null}
    </>
  );
}

function NewSession({ ctx, agents }: { ctx: Ctx; agents: Named[] }) {
  const envs = useAsync(() => everyPage(async (page) => (await ok(ctx.api.GET('/v1/environments', { params: { query: { limit: 100, ...(page ? { page } : {}) } } }))) as ListPage<Named>), []);
  const [agentId, setAgentId] = useState('');
  const [name, setName] = useState('assistant');
  const [model, setModel] = useState('default');
  const [system, setSystem] = useState('');
  const [envId, setEnvId] = useState('');
  const [title, setTitle] = useState('');
  const [error, setError] = useState<string | null>(null);
  const [busy, setBusy] = useState(false);

  async function create(e: Event) {
    e.preventDefault();
    setBusy(true);
    setError(null);
    try {
      const environment = envId || envs.data?.[0]?.id;
      if (!environment) throw new Error('create an Environment first (POST /v1/environments)');
      const agent = agentId ? agentId : { name, model, ...(system.trim() ? { system } : {}) };
      const body = { agent, environment_id: environment, ...(title.trim() ? { title: title.trim() } : {}) };
      const s = (await ok(ctx.api.POST('/v1/sessions', { body: body as never, headers: { 'idempotency-key': idempotencyKey() } }))) as { id: string };
      location.hash = `#/sessions/${s.id}`;
    } catch (err) {
      setError(describeError(err));
    } finally {
      setBusy(false);
    }
  }

  return (
    <Section title="New session">
      <form class="stack" onSubmit={create}>
        <div class="grid2">
          <div class="field">
            <label for="n-agent">Agent</label>
            <select id="n-agent" value={agentId} onChange={(e) => setAgentId(e.currentTarget.value)}>
              <option value="">Inline agent (below)</option>
              {agents.map((a) => <option key={a.id} value={a.id}>{a.name}</option>)}
            </select>
          </div>
          <div class="field">
            <label for="n-env">Environment</label>
            <select id="n-env" value={envId} onChange={(e) => setEnvId(e.currentTarget.value)}>
              {(envs.data ?? []).map((x) => <option key={x.id} value={x.id}>{x.name} ({x.id})</option>)}
            </select>
          </div>
          <div class="field">
            <label for="n-title">Title</label>
            <input id="n-title" value={title} onInput={(e) => setTitle(e.currentTarget.value)} />
          </div>
        </div>
        {agentId === '' ? (
          <fieldset>
            <legend>Inline agent</legend>
            <div class="grid2">
              <div class="field"><label for="n-name">Name</label><input id="n-name" required value={name} onInput={(e) => setName(e.currentTarget.value)} /></div>
              <div class="field"><label for="n-model">Model</label><input id="n-model" required value={model} onInput={(e) => setModel(e.currentTarget.value)} /></div>
            </div>
            <div class="field"><label for="n-system">System prompt</label><textarea id="n-system" rows={4} value={system} onInput={(e) => setSystem(e.currentTarget.value)} /></div>
          </fieldset>
        ) : null}
        <ErrorBanner error={error ?? envs.error} />
        <div><button type="submit" class="primary" disabled={busy}>{busy ? 'Creating…' : 'Create session'}</button></div>
      </form>
    </Section>
  );
}
