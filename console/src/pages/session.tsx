import { memo } from 'preact/compat';
import { useEffect, useMemo, useRef, useState } from 'preact/hooks';
import { describeError, everyPage, idempotencyKey, ok, type ListPage } from '../api';
import type { Ctx } from '../main';
import { Markdown } from '../markdown';
import { openSessionStream, type StreamEvent, type StreamState } from '../sse';
import { Badge, ErrorBanner, fmtTime, fmtUsd, Json, Section, useAsync } from '../ui';
import type { SessionView } from './sessions';

interface Thread { id: string; parent_thread_id: string | null; status: string; agent?: { name?: string } }
interface RunView { id: string; status: string; session_thread_id: string; timestamps?: Record<string, string | null>; attempts?: unknown[] }
interface UsageView { summary: { usage: { input_tokens: number; output_tokens: number; total_tokens: number; cached_input_tokens: number }; list_cost: { amount: number }; steps: number } }
interface Principal { id: string; display_name?: string | null; external_subject_id?: string }

const AUTHOR_KEY = 'agentplane.console.author';
/** A Session id as the API writes it: a page for anything else asks the API nothing. */
const SESSION_ID = /^sess_[0-9a-f]{32}$/;

/** Text of a message payload: a string, or the text of its text/thinking blocks. */
export function contentText(content: unknown): string {
  if (typeof content === 'string') return content;
  if (Array.isArray(content)) {
    return content
      .map((b) => (b && typeof b === 'object' && 'text' in b && typeof (b as { text: unknown }).text === 'string' ? (b as { text: string }).text : ''))
      .filter(Boolean)
      .join('\n');
  }
  if (content === undefined || content === null) return '';
  return JSON.stringify(content, null, 2);
}

/** A `user.question_answer` in one line: each answer's choices and text, or the decline. */
function questionAnswerText(p: Record<string, unknown>): string {
  if (p.declined) return typeof p.reason === 'string' && p.reason ? `declined (${p.reason})` : 'declined';
  const answers = Array.isArray(p.answers) ? (p.answers as { text?: unknown; selected?: unknown }[]) : [];
  return answers.map((a) => {
    const parts = [...(Array.isArray(a.selected) ? a.selected.map(String) : []), ...(typeof a.text === 'string' && a.text ? [a.text] : [])];
    return parts.length > 0 ? parts.join(', ') : '—';
  }).join(' · ');
}

function stopReason(p: Record<string, unknown>): string {
  const s = p.stop_reason as { type?: string } | undefined;
  return s?.type ?? '';
}

/** An `ask_user` answer: one entry per question, in order, or the decline. */
type QuestionReply = { answers: { text?: string; selected?: string[] }[] } | { declined: true; reason?: string };

interface ItemProps {
  ev: StreamEvent;
  pending: boolean;
  onAnswer(ev: StreamEvent, kind: 'custom' | 'confirm', value: string, allow: boolean): Promise<void>;
  onQuestion(ev: StreamEvent, reply: QuestionReply): Promise<void>;
}

const EventItem = memo(function EventItem({ ev, pending, onAnswer, onQuestion }: ItemProps) {
  const p = ev.payload;
  const common = { 'data-seq': ev.seq, 'data-type': ev.type } as const;
  switch (ev.type) {
    case 'user.message':
      return <li {...common} class="msg user"><div class="who">User</div><Markdown text={contentText(p.content)} /></li>;
    case 'agent.message':
      return <li {...common} class="msg agent"><div class="who">Agent</div><Markdown text={contentText(p.content)} /></li>;
    case 'agent.thinking':
      return (
        <li {...common} class="thinking">
          <details><summary>Thinking</summary><div class="pre-wrap">{contentText(p.content)}</div></details>
        </li>
      );
    case 'agent.tool_use':
      return (
        <li {...common} class="tool">
          <div class="tool-head"><span class="tag">tool call</span> <strong class="mono">{String(p.name)}</strong> {p.awaiting ? <Badge value={pending ? `awaiting ${String(p.awaiting)}` : 'answered'} /> : null}</div>
          <details open={pending}><summary>Arguments</summary><Json value={p.input} /></details>
          {pending ? (p.awaiting === 'question_answer' ? <QuestionForm ev={ev} onQuestion={onQuestion} /> : <AnswerForm ev={ev} onAnswer={onAnswer} />) : null}
        </li>
      );
    case 'agent.tool_result':
      return (
        <li {...common} class={`tool result${p.is_error ? ' is-error' : ''}`}>
          <details><summary><span class="tag">{p.is_error ? 'tool error' : 'tool result'}</span> <span class="mono small">{String(p.tool_use_id ?? '')}</span></summary>
            <Json value={typeof p.content === 'string' || Array.isArray(p.content) ? contentText(p.content) : p.content} />
          </details>
        </li>
      );
    case 'user.custom_tool_result':
    case 'user.tool_confirmation':
      return <li {...common} class="note">Answered <span class="mono">{String(p.tool_use_id)}</span>: {ev.type === 'user.tool_confirmation' ? String(p.result) : contentText(p.result)}</li>;
    case 'user.question_answer':
      return <li {...common} class="note">Answered <span class="mono">{String(p.tool_use_id)}</span>: {questionAnswerText(p)}</li>;
    case 'user.interrupt':
      return <li {...common} class="note">Interrupt requested</li>;
    case 'session.status_running':
      return <li {...common} class="status">Running{p.run_id ? <> · <a href={`#/runs/${String(p.run_id)}`}>run</a></> : null}</li>;
    case 'session.status_idle':
      return <li {...common} class="status">Idle · <span class="stop">{stopReason(p)}</span></li>;
    case 'gap':
      return <li {...common} class="note">Events {String(p.from_seq)}–{String(p.to_seq)} are gone ({String(p.reason)})</li>;
    default:
      if (ev.type.includes('error') || ev.type.endsWith('terminated')) {
        return <li {...common} class="error-item" role="note"><strong>{ev.type}</strong><Json value={p} /></li>;
      }
      return <li {...common} class="note"><details><summary>{ev.type}</summary><Json value={p} /></details></li>;
  }
});

function AnswerForm({ ev, onAnswer }: { ev: StreamEvent; onAnswer: ItemProps['onAnswer'] }) {
  const [value, setValue] = useState('');
  const [busy, setBusy] = useState(false);
  const confirm = ev.payload.awaiting === 'tool_confirmation';
  const id = `answer-${ev.seq}`;
  const go = async (allow: boolean) => {
    setBusy(true);
    try {
      await onAnswer(ev, confirm ? 'confirm' : 'custom', value, allow);
    } finally {
      setBusy(false);
    }
  };
  if (confirm) {
    return (
      <div class="answer">
        <label for={id}>Reason if denied (optional)</label>
        <input id={id} value={value} onInput={(e) => setValue(e.currentTarget.value)} />
        <div class="row"><button type="button" class="primary" disabled={busy} onClick={() => void go(true)}>Allow</button><button type="button" disabled={busy} onClick={() => void go(false)}>Deny</button></div>
      </div>
    );
  }
  return (
    <form class="answer" onSubmit={(e) => { e.preventDefault(); void go(true); }}>
      <label for={id}>Result for {String(ev.payload.name)}</label>
      <textarea id={id} rows={2} value={value} onInput={(e) => setValue(e.currentTarget.value)} />
      <div class="row"><button type="submit" class="primary" disabled={busy || value === ''}>Send result</button></div>
    </form>
  );
}

interface Question { question: string; options: string[] | null; multiple: boolean; allowOther: boolean }

/** The questions of an `ask_user` use (its input, as the platform checked it). */
function questionsOf(input: unknown): Question[] {
  const qs = input && typeof input === 'object' ? (input as { questions?: unknown }).questions : undefined;
  if (!Array.isArray(qs)) return [];
  return qs.flatMap((q: unknown) => {
    if (!q || typeof q !== 'object' || typeof (q as { question?: unknown }).question !== 'string') return [];
    const o = q as { question: string; options?: unknown; multiple?: unknown; allow_other?: unknown };
    const options = Array.isArray(o.options) ? o.options.filter((x): x is string => typeof x === 'string') : null;
    return [{ question: o.question, options: options && options.length > 0 ? options : null, multiple: o.multiple === true, allowOther: o.allow_other === true }];
  });
}

/** Answers an `ask_user` wait (`user.question_answer`): per question a choice and/or free text, or a decline. */
function QuestionForm({ ev, onQuestion }: { ev: StreamEvent; onQuestion: ItemProps['onQuestion'] }) {
  const questions = useMemo(() => questionsOf(ev.payload.input), [ev]);
  const [selected, setSelected] = useState<string[][]>(() => questions.map(() => []));
  const [texts, setTexts] = useState<string[]>(() => questions.map(() => ''));
  const [reason, setReason] = useState('');
  const [busy, setBusy] = useState(false);
  const id = `answer-${ev.seq}`;
  const go = async (reply: QuestionReply) => {
    setBusy(true);
    try {
      await onQuestion(ev, reply);
    } finally {
      setBusy(false);
    }
  };
  const pick = (i: number, option: string, on: boolean, multiple: boolean) =>
    setSelected((all) => all.map((sel, j) => (j !== i ? sel : multiple ? (on ? [...sel, option] : sel.filter((x) => x !== option)) : on ? [option] : [])));
  const setText = (i: number, value: string) => setTexts((all) => all.map((t, j) => (j === i ? value : t)));
  // Every question gets an entry (the agent reads them in order); one left blank is an empty text.
  const answers = questions.map((_, i) => {
    const sel = selected[i] ?? [];
    const text = texts[i] ?? '';
    return { ...(sel.length > 0 ? { selected: sel } : {}), ...(text !== '' || sel.length === 0 ? { text } : {}) };
  });
  const anything = answers.some((a) => (a.selected?.length ?? 0) > 0 || (a.text ?? '').trim() !== '');
  return (
    <form class="answer" data-testid="question-form" onSubmit={(e) => { e.preventDefault(); void go({ answers }); }}>
      {questions.map((q, i) => (
        <fieldset key={i} class="question">
          <legend>{q.question}</legend>
          {(q.options ?? []).map((o, j) => (
            <div key={j} class="field check">
              <input id={`${id}-${i}-${j}`} type={q.multiple ? 'checkbox' : 'radio'} name={`${id}-${i}`} checked={(selected[i] ?? []).includes(o)}
                onChange={(e) => pick(i, o, e.currentTarget.checked, q.multiple)} />
              <label for={`${id}-${i}-${j}`}>{o}</label>
            </div>
          ))}
          {q.options === null || q.allowOther ? (
            <div class="field">
              <label for={`${id}-${i}-text`}>{q.options === null ? 'Answer' : 'Other'}</label>
              <input id={`${id}-${i}-text`} value={texts[i] ?? ''} onInput={(e) => setText(i, e.currentTarget.value)} />
            </div>
          ) : null}
        </fieldset>
      ))}
      <label for={`${id}-reason`}>Reason if declined (optional)</label>
      <input id={`${id}-reason`} value={reason} onInput={(e) => setReason(e.currentTarget.value)} />
      <div class="row">
        <button type="submit" class="primary" disabled={busy || !anything}>Send answers</button>
        <button type="button" disabled={busy} onClick={() => void go({ declined: true, ...(reason.trim() ? { reason: reason.trim() } : {}) })}>Decline</button>
      </div>
    </form>
  );
}

export function SessionPage({ ctx, id }: { ctx: Ctx; id: string }) {
  const [events, setEvents] = useState<StreamEvent[]>([]);
  const [stream, setStream] = useState<{ state: StreamState; reconnects: number; message?: string }>({ state: 'connecting', reconnects: 0 });
  const [threadFilter, setThreadFilter] = useState('');
  const [text, setText] = useState('');
  const [actionError, setActionError] = useState<string | null>(null);
  const [busy, setBusy] = useState(false);
  const [author, setAuthor] = useState(() => sessionStorage.getItem(AUTHOR_KEY) ?? '');
  const [idleCount, setIdleCount] = useState(0);
  const endRef = useRef<HTMLDivElement>(null);
  const follow = useRef(true);

  // A Session that is not there (a mistyped or deleted id) is one read and one message: its
  // stream and side panel are asked for only once the Session itself was read.
  const wellFormed = SESSION_ID.test(id);
  const session = useAsync(async () => {
    if (!wellFormed) throw new Error(`'${id}' is not a Session id (sess_ and 32 hex digits)`);
    return (await ok(ctx.api.GET('/v1/sessions/{session_id}', { params: { path: { session_id: id } } }))) as unknown as SessionView;
  }, [id, idleCount]);
  const known = session.data?.id === id;
  const threads = useAsync(async () => (known ? ((await ok(ctx.api.GET('/v1/sessions/{session_id}/threads', { params: { path: { session_id: id } } }))) as unknown as { data: Thread[] }).data : undefined), [id, idleCount, known]);
  const runs = useAsync(async () => (known ? ((await ok(ctx.api.GET('/v1/sessions/{session_id}/runs', { params: { path: { session_id: id } } }))) as { data: RunView[] }).data : undefined), [id, idleCount, known]);
  const usage = useAsync(async () => (known ? (await ok(ctx.api.GET('/v1/sessions/{session_id}/usage', { params: { path: { session_id: id } } }))) as UsageView : undefined), [id, idleCount, known]);
  const principals = useAsync(() => everyPage(async (page) => (await ok(ctx.api.GET('/v1/organizations/workspaces/{workspace_id}/principals', { params: { path: { workspace_id: ctx.workspaceId }, query: { limit: 100, ...(page ? { page } : {}) } } }))) as ListPage<Principal>), [ctx.workspaceId]);

  // The author is one of the Workspace's Principals: a remembered one that is not (it came from a
  // credential of another Workspace in this tab, or was deleted) is replaced by the first.
  useEffect(() => {
    if (principals.data && !principals.data.some((pr) => pr.id === author)) setAuthor(principals.data[0]?.id ?? '');
  }, [principals.data, author]);
  useEffect(() => {
    if (author) sessionStorage.setItem(AUTHOR_KEY, author);
  }, [author]);

  // Status changes refresh the side panel (Session, threads, Runs, usage): at most every 500 ms,
  // trailing, so a burst of turns costs a handful of reads and the documents have settled.
  const refreshTimer = useRef<ReturnType<typeof setTimeout> | undefined>(undefined);
  const refreshSoon = () => {
    if (refreshTimer.current !== undefined) return;
    refreshTimer.current = setTimeout(() => {
      refreshTimer.current = undefined;
      setIdleCount((n) => n + 1);
    }, 500);
  };
  useEffect(() => () => clearTimeout(refreshTimer.current), []);

  const pending = useRef<StreamEvent[]>([]);
  const frame = useRef<number | undefined>(undefined);
  useEffect(() => {
    setEvents([]);
    pending.current = [];
    if (!known) return undefined;
    const close = openSessionStream(ctx.auth, `/v1/sessions/${encodeURIComponent(id)}/events/stream`, {
      onEvents: (batch) => {
        // Coalesce network chunks into one render per animation frame (a replay arrives in many).
        for (const e of batch) pending.current.push(e);
        if (frame.current === undefined) {
          frame.current = requestAnimationFrame(() => {
            frame.current = undefined;
            const next = pending.current;
            pending.current = [];
            setEvents((prev) => prev.concat(next));
          });
        }
        if (batch.some((e) => e.type.startsWith('session.status_') || e.type.startsWith('session.thread_status_'))) refreshSoon();
      },
      onState: (state, d) => setStream({ state, reconnects: d.reconnects, ...(d.message ? { message: d.message } : {}) }),
    });
    return () => {
      close();
      if (frame.current !== undefined) cancelAnimationFrame(frame.current);
      frame.current = undefined;
    };
  }, [id, ctx.auth, known]);

  useEffect(() => {
    if (follow.current) endRef.current?.scrollIntoView({ block: 'end' });
  }, [events]);

  const answered = useMemo(() => {
    const s = new Set<string>();
    for (const e of events) {
      // An answer of any kind, or a result the platform recorded for the use (an interrupt that
      // ended the wait), ends its wait.
      if (e.type === 'user.custom_tool_result' || e.type === 'user.tool_confirmation' || e.type === 'user.question_answer' || e.type === 'agent.tool_result'
        || e.type === 'session.action_approval_resolved' || e.type === 'session.action_approval_expired') {
        s.add(String(e.payload.tool_use_id));
      }
    }
    return s;
  }, [events]);
  // Tool uses an ActionPolicy put under an ActionApproval: answered by resolving the approval, not by a drive event.
  const approvals = useMemo(() => {
    const m = new Map<string, string>();
    for (const e of events) if (e.type === 'session.action_approval_requested') m.set(String(e.payload.tool_use_id), String(e.payload.approval_id));
    return m;
  }, [events]);

  // Status per thread from the last status event.
  const status = useMemo(() => {
    let last: StreamEvent | undefined;
    for (let i = events.length - 1; i >= 0; i--) {
      const e = events[i] as StreamEvent;
      if (e.type.startsWith('session.status_')) { last = e; break; }
    }
    if (!last) return { state: session.data?.status ?? 'idle', reason: '' };
    return { state: last.type.replace('session.status_', ''), reason: last.type === 'session.status_idle' ? stopReason(last.payload) : '' };
  }, [events, session.data]);

  const shown = threadFilter ? events.filter((e) => e.session_thread_id === threadFilter || e.session_thread_id === null) : events;
  // A tool use still waiting on its answer: an interrupt ends the wait (and its turn) too.
  const waiting = useMemo(() => events.some((e) => !!e.payload.awaiting && !answered.has(String(e.payload.id))), [events, answered]);

  async function drive(body: { type: string; payload: Record<string, unknown> }) {
    setActionError(null);
    setBusy(true);
    try {
      await ok(ctx.api.POST('/v1/sessions/{session_id}/events', {
        params: { path: { session_id: id } },
        body: { type: body.type, payload: { ...body.payload, authored_by: author, caused_by: { kind: 'api' } } } as never,
        headers: { 'idempotency-key': idempotencyKey() },
      }));
    } catch (err) {
      setActionError(describeError(err));
      throw err;
    } finally {
      setBusy(false);
    }
  }

  const thread = threadFilter ? { session_thread_id: threadFilter } : {};
  // Ctrl+Enter submits the form even while the Send button is disabled: a message being sent is
  // not sent again (a ref, set at once, since a second key press can come before the re-render).
  const sending = useRef(false);
  async function send(e: Event) {
    e.preventDefault();
    if (sending.current || busy || archived || !author || !text.trim()) return;
    sending.current = true;
    try {
      await drive({ type: 'user.message', payload: { content: text, ...thread } });
      setText('');
    } catch { /* shown */ } finally {
      sending.current = false;
    }
  }
  const onAnswer = async (ev: StreamEvent, kind: 'custom' | 'confirm', value: string, allow: boolean) => {
    const approval = approvals.get(String(ev.payload.id));
    if (kind === 'confirm' && approval) {
      setActionError(null);
      try {
        await ok(ctx.api.POST(allow ? '/v1/action-approvals/{approval_id}/approve' : '/v1/action-approvals/{approval_id}/deny', {
          params: { path: { approval_id: approval } }, body: allow || !value ? {} : { reason: value },
          headers: { 'idempotency-key': idempotencyKey() },
        }));
      } catch (err) {
        setActionError(describeError(err));
      }
      return;
    }
    const t = ev.session_thread_id ? { session_thread_id: ev.session_thread_id } : {};
    await drive(kind === 'custom'
      ? { type: 'user.custom_tool_result', payload: { tool_use_id: ev.payload.id, result: value, ...t } }
      : { type: 'user.tool_confirmation', payload: { tool_use_id: ev.payload.id, result: allow ? 'allow' : 'deny', ...(allow || !value ? {} : { deny_message: value }), ...t } }).catch(() => undefined);
  };
  const onQuestion = async (ev: StreamEvent, reply: QuestionReply) => {
    const t = ev.session_thread_id ? { session_thread_id: ev.session_thread_id } : {};
    await drive({ type: 'user.question_answer', payload: { tool_use_id: ev.payload.id, ...reply, ...t } }).catch(() => undefined);
  };
  async function archive() {
    if (!confirm('Archive this session? It takes no more messages.')) return;
    setActionError(null);
    try {
      await ok(ctx.api.POST('/v1/sessions/{session_id}/archive', { params: { path: { session_id: id } } }));
      session.reload();
    } catch (err) {
      setActionError(describeError(err));
    }
  }

  if (!known && session.error) {
    return (
      <div class="page-head" data-testid="session-missing">
        <div>
          <h1>Session</h1>
          <div class="muted mono small">{id}</div>
          <ErrorBanner error={session.error} />
          <p><a href="#/sessions">Back to Sessions</a></p>
        </div>
      </div>
    );
  }
  const s = known ? session.data : undefined;
  const u = usage.data?.summary;
  const archived = !!s?.archived_at;
  return (
    <div class="session-layout">
      <div class="conversation-col">
        <div class="page-head">
          <div>
            <h1>{s?.title || 'Session'}</h1>
            <div class="muted mono small">{id}</div>
          </div>
          <div class="row">
            <span class="status-line" aria-live="polite">
              <Badge value={archived ? 'archived' : status.state} />{status.reason ? <span class="stop" data-stop-reason={status.reason}> {status.reason}</span> : null}
            </span>
            <span class={`stream stream-${stream.state}`} data-stream-state={stream.state} data-reconnects={stream.reconnects} title={stream.message ?? ''}>
              {stream.state === 'live' ? 'live' : stream.state}
            </span>
          </div>
        </div>
        <ErrorBanner error={session.error ?? (stream.state === 'failed' || stream.state === 'deleted' ? stream.message : null)} />
        <ol class="conversation" aria-label="Conversation" aria-live="polite" aria-relevant="additions"
          onScroll={(e) => { const el = e.currentTarget; follow.current = el.scrollHeight - el.scrollTop - el.clientHeight < 80; }}>
          {shown.map((ev) => (
            <EventItem key={ev.seq} ev={ev} pending={!!ev.payload.awaiting && !answered.has(String(ev.payload.id))} onAnswer={onAnswer} onQuestion={onQuestion} />
          ))}
          {shown.length === 0 && stream.state === 'live' ? <li class="note">No events yet.</li> : null}
          <div ref={endRef} />
        </ol>
        <form class="composer" onSubmit={send}>
          <label for="composer-text" class="sr-only">Message</label>
          <textarea id="composer-text" rows={3} placeholder={archived ? 'Archived' : 'Message the agent (Ctrl+Enter sends)'} disabled={archived} value={text}
            onInput={(e) => setText(e.currentTarget.value)}
            onKeyDown={(e) => { if (e.key === 'Enter' && (e.ctrlKey || e.metaKey)) { e.preventDefault(); (e.currentTarget.form as HTMLFormElement).requestSubmit(); } }} />
          <div class="row">
            <button type="submit" class="primary" disabled={busy || archived || !text.trim() || !author}>Send</button>
            <button type="button" disabled={busy || archived || (status.state !== 'running' && !waiting)} onClick={() => void drive({ type: 'user.interrupt', payload: { ...thread } }).catch(() => undefined)}>Interrupt</button>
            <span class="grow" />
            <label for="author" class="small muted">As</label>
            {principals.data ? (
              <select id="author" value={author} onChange={(e) => setAuthor(e.currentTarget.value)}>
                {principals.data.map((pr) => <option key={pr.id} value={pr.id}>{pr.display_name || pr.external_subject_id || pr.id}</option>)}
              </select>
            ) : (
              <input id="author" class="mono" placeholder="prin_…" value={author} onInput={(e) => setAuthor(e.currentTarget.value)} />
            )}
          </div>
          <ErrorBanner error={actionError} />
        </form>
      </div>
      <aside class="side" aria-label="Session details">
        <Section title="Details" actions={<button type="button" onClick={() => void archive()} disabled={archived}>Archive</button>}>
          <dl class="kv">
            <dt>Agent</dt><dd>{s?.agent?.name ?? '—'}</dd>
            <dt>Environment</dt><dd class="mono small">{s?.environment_id ?? '—'}</dd>
            <dt>Created</dt><dd>{fmtTime(s?.created_at)}</dd>
            {archived ? <><dt>Archived</dt><dd>{fmtTime(s?.archived_at)}</dd></> : null}
          </dl>
        </Section>
        <Section title="Usage">
          {u ? (
            <dl class="kv" data-testid="usage">
              <dt>Input tokens</dt><dd>{u.usage.input_tokens}</dd>
              <dt>Cached input</dt><dd>{u.usage.cached_input_tokens}</dd>
              <dt>Output tokens</dt><dd>{u.usage.output_tokens}</dd>
              <dt>Model steps</dt><dd>{u.steps}</dd>
              <dt>List cost</dt><dd>{fmtUsd(u.list_cost.amount)}</dd>
            </dl>
          ) : <p class="muted">{usage.error ?? 'No usage yet.'}</p>}
        </Section>
        <Section title="Threads">
          <label for="thread-filter" class="small">Show</label>
          <select id="thread-filter" value={threadFilter} onChange={(e) => setThreadFilter(e.currentTarget.value)}>
            <option value="">All threads</option>
            {(threads.data ?? []).map((t) => <option key={t.id} value={t.id}>{t.parent_thread_id ? 'child' : 'primary'} · {t.id.slice(0, 14)}…</option>)}
          </select>
          <ul class="plain">
            {(threads.data ?? []).map((t) => <li key={t.id} class="small"><span class="mono">{t.id.slice(0, 14)}…</span> <Badge value={t.status} /></li>)}
          </ul>
        </Section>
        <Section title="Runs">
          <ul class="plain">
            {(runs.data ?? []).map((r) => (
              <li key={r.id} class="small"><a class="mono" href={`#/runs/${r.id}`}>{r.id.slice(0, 16)}…</a> <Badge value={r.status} /></li>
            ))}
            {runs.data && runs.data.length === 0 ? <li class="muted small">No runs yet.</li> : null}
          </ul>
        </Section>
      </aside>
    </div>
  );
}
