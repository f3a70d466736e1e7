import './styles.css';
import { render } from 'preact';
import { useEffect, useState } from 'preact/hooks';
import { ApiProblem, clearAuth, describeError, loadAuth, makeClient, ok, saveAuth, type ApiClient, type Auth } from './api';
import { SessionsPage } from './pages/sessions';
import { SessionPage } from './pages/session';
import { RunPage } from './pages/run';
import { RunnersPage } from './pages/runners';
import { ModelsPage } from './pages/models';

export interface Ctx {
  api: ApiClient;
  auth: Auth;
  /** The workspace the API resolved for this credential (Service-Workspace-Id answer header). */
  workspaceId: string;
}

/** Top-level navigation; later areas (approvals, automations, audit) add an entry and a page here. */
const NAV: { path: string; label: string }[] = [
  { path: 'sessions', label: 'Sessions' },
  { path: 'runners', label: 'Runners' },
  { path: 'models', label: 'Models' },
];

/** A route segment as typed: one that is not valid percent-encoding stays as it is (decodeURIComponent would throw). */
function decodePart(part: string): string {
  try {
    return decodeURIComponent(part);
  } catch {
    return part;
  }
}

function useHash(): string {
  const [hash, setHash] = useState(location.hash);
  useEffect(() => {
    const on = () => setHash(location.hash);
    addEventListener('hashchange', on);
    return () => removeEventListener('hashchange', on);
  }, []);
  return hash;
}

function SignIn({ onSignedIn }: { onSignedIn(auth: Auth, workspaceId: string): void }) {
  const [token, setToken] = useState('');
  const [workspace, setWorkspace] = useState('');
  const [error, setError] = useState<string | null>(null);
  const [busy, setBusy] = useState(false);
  async function submit(e: Event) {
    e.preventDefault();
    setBusy(true);
    setError(null);
    const auth: Auth = { token: token.trim(), workspaceId: workspace.trim() || null };
    try {
      const ws = await probe(auth);
      saveAuth(auth);
      onSignedIn(auth, ws);
    } catch (err) {
      setError(describeError(err));
    } finally {
      setBusy(false);
    }
  }
  return (
    <main class="signin" id="main">
      <form class="card" onSubmit={submit} aria-labelledby="signin-title">
        <h1 id="signin-title">agentplane console</h1>
        <p class="muted">Sign in with an API key or a Principal access credential. It is kept in this tab's session storage only.</p>
        <label for="token">Credential</label>
        <input id="token" name="token" type="password" autocomplete="off" required value={token} onInput={(e) => setToken(e.currentTarget.value)} />
        <label for="workspace">Workspace id <span class="muted">(organization-scoped keys only; Service-Workspace-Id)</span></label>
        <input id="workspace" name="workspace" type="text" autocomplete="off" placeholder="wrkspc_…" value={workspace} onInput={(e) => setWorkspace(e.currentTarget.value)} />
        {error ? <p class="error" role="alert">{error}</p> : null}
        <button type="submit" class="primary" disabled={busy || token.trim() === ''}>{busy ? 'Signing in…' : 'Sign in'}</button>
      </form>
    </main>
  );
}

/** Check the credential with a cheap read and learn the workspace the API acts in. */
async function probe(auth: Auth): Promise<string> {
  const api = makeClient(auth);
  // Any API key role and a Principal access credential may read the capabilities.
  const r = await api.GET('/v1/support/capabilities');
  await ok(Promise.resolve(r));
  return r.response.headers.get('service-workspace-id') ?? auth.workspaceId ?? '';
}

function App() {
  const [ctx, setCtx] = useState<Ctx | null>(null);
  const [checking, setChecking] = useState(true);
  const hash = useHash();

  // Why the saved credential could not be checked this time (the API unreachable or failing):
  // it is kept, and the check can be tried again.
  const [unreachable, setUnreachable] = useState<string | null>(null);
  const [attempt, setAttempt] = useState(0);

  useEffect(() => {
    const saved = loadAuth();
    if (!saved) {
      setChecking(false);
      return;
    }
    setChecking(true);
    setUnreachable(null);
    probe(saved).then(
      (ws) => { setCtx({ api: makeClient(saved), auth: saved, workspaceId: ws }); setChecking(false); },
      (err: unknown) => {
        // Only the API's refusal of the credential (a client error) forgets it; a failure that
        // may heal (no answer, 5xx, 408, 429) keeps it for another try.
        if (err instanceof ApiProblem && err.status >= 400 && err.status < 500 && err.status !== 408 && err.status !== 429) clearAuth();
        else setUnreachable(describeError(err));
        setChecking(false);
      },
    );
  }, [attempt]);

  if (checking) return <main class="signin" id="main"><p aria-live="polite">Loading…</p></main>;
  if (!ctx && unreachable !== null) {
    return (
      <main class="signin" id="main">
        <div class="card stack" data-testid="unreachable">
          <p class="error" role="alert">The credential could not be checked: {unreachable}</p>
          <div class="row">
            <button type="button" class="primary" onClick={() => setAttempt((n) => n + 1)}>Try again</button>
            <button type="button" onClick={() => { clearAuth(); setUnreachable(null); }}>Sign out</button>
          </div>
        </div>
      </main>
    );
  }
  if (!ctx) return <SignIn onSignedIn={(auth, ws) => setCtx({ api: makeClient(auth), auth, workspaceId: ws })} />;

  const parts = hash.replace(/^#\/?/, '').split('/').filter(Boolean).map(decodePart);
  const [area = 'sessions', id] = parts;
  let page;
  if (area === 'sessions' && id) page = <SessionPage ctx={ctx} id={id} />;
  else if (area === 'runs' && id) page = <RunPage ctx={ctx} id={id} />;
  else if (area === 'runners') page = <RunnersPage ctx={ctx} />;
  else if (area === 'models') page = <ModelsPage ctx={ctx} />;
  else page = <SessionsPage ctx={ctx} />;
  const current = area === 'runs' ? 'sessions' : area;

  return (
    <div class="shell">
      <button type="button" class="skip" onClick={() => document.getElementById('main')?.focus()}>Skip to content</button>
      <header class="top">
        <a class="brand" href="#/sessions">agentplane</a>
        <nav aria-label="Main">
          <ul>
            {NAV.map((n) => (
              <li key={n.path}><a href={`#/${n.path}`} aria-current={current === n.path ? 'page' : undefined}>{n.label}</a></li>
            ))}
          </ul>
        </nav>
        <div class="who">
          <span class="muted mono" title="Workspace">{ctx.workspaceId}</span>
          <button type="button" onClick={() => { clearAuth(); setCtx(null); location.hash = ''; }}>Sign out</button>
        </div>
      </header>
      <main id="main" tabIndex={-1}>{page}</main>
    </div>
  );
}

const root = document.getElementById('app');
if (root) render(<App />, root);
