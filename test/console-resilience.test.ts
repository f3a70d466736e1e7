/**
 * The web console (headless Chromium) where a link, the API or the tab's history is not what the
 * happy path expects: a route that is not valid percent-encoding, a Run route that would leave
 * /v1/runs/, an API that fails while a signed-in tab reloads (the credential is kept; only the
 * API's refusal of it signs out), and an author remembered from a credential of another
 * Workspace in the same tab.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startPlatform, type Platform } from './harness/platform.js';
import { launchBrowser, type TestBrowser } from './harness/browser.js';

let p: Platform;
let b: TestBrowser;

const AUTH_KEY = 'agentplane.console.auth';
const stored = () => b.page.evaluate(`sessionStorage.getItem(${JSON.stringify(AUTH_KEY)})`) as Promise<string | null>;

async function signIn(token: string, workspace = ''): Promise<void> {
  const { page } = b;
  await page.goto(`${p.baseUrl}/console/`);
  // A tab still signed in signs out first.
  const signOut = page.getByRole('button', { name: 'Sign out' });
  await signOut.or(page.getByLabel('Credential')).first().waitFor();
  if (await signOut.isVisible()) await signOut.click();
  await page.getByLabel('Credential').fill(token);
  if (workspace) await page.getByLabel(/Workspace id/).fill(workspace);
  await page.getByRole('button', { name: 'Sign in' }).click();
  await page.getByRole('heading', { name: 'Sessions', level: 1 }).waitFor();
}

/** A Session in `workspace` (the root key's default one when omitted), with a Principal to author drive events. */
async function sessionIn(workspace: string, who: string): Promise<string> {
  const opts = { headers: { 'service-workspace-id': workspace } };
  await p.root.post(`/v1/organizations/workspaces/${workspace}/principals`, { external_subject_id: who, principal_type: 'person', display_name: who });
  const env = (await p.root.post<{ id: string }>('/v1/environments', { name: 'default', image: 'agentplane/sandbox:1' }, opts)).id;
  const agent = (await p.root.post<{ id: string }>('/v1/agents', { name: 'a', model: 'default' }, opts)).id;
  return (await p.root.post<{ id: string }>('/v1/sessions', { agent, environment_id: env }, opts)).id;
}

beforeAll(async () => {
  p = await startPlatform();
  b = await launchBrowser();
  b.page.setDefaultTimeout(20_000);
}, 120_000);
afterAll(async () => {
  await b?.close();
  await p?.stop();
});

describe('console routes from links', () => {
  it('a route that is not valid percent-encoding is a message, not a page stuck loading', async () => {
    await signIn(p.bootstrap.root_key);
    const { page } = b;
    // A fresh load of the broken link (not a hash change within the loaded app).
    await page.goto('about:blank');
    const errorsBefore = b.errors.length;
    await page.goto(`${p.baseUrl}/console/#/sessions/%E0%A4%A`);
    await page.locator('[data-testid="session-missing"]').getByText('is not a Session id').waitFor();
    expect(b.errors.slice(errorsBefore)).toEqual([]);
  });

  it('a Run route that is not a Run id asks the API nothing', async () => {
    await signIn(p.bootstrap.root_key);
    const { page } = b;
    for (const id of ['..', '.', '%2E%2E']) {
      const requestsBefore = b.requests.length;
      await page.goto(`${p.baseUrl}/console/#/runs/${id}`);
      await page.getByRole('alert').getByText('is not a Run id').waitFor();
      // `..` would have become GET /v1/ (the URL parser resolves it), outside /v1/runs/.
      const asked = b.requests.slice(requestsBefore).map((u) => new URL(u).pathname).filter((path) => path === '/v1/' || path.startsWith('/v1/runs'));
      expect(asked, id).toEqual([]);
    }
  });
});

describe('console sign-in kept across reloads', () => {
  it('keeps the credential when the API fails on reload, and forgets it once the API refuses it', async () => {
    const key = (await p.root.post<{ id: string; secret: string }>(`/v1/organizations/${p.bootstrap.organization_id}/api-keys`, {
      display_name: 'console reload', role: 'viewer', scope: { type: 'workspace', workspace_id: p.bootstrap.workspace_id },
    }, { idempotencyKey: 'console-resilience-key' }));
    await signIn(key.secret);
    const { page } = b;
    // The API answers 503 (a restart, a failover) while the tab reloads: the credential stays.
    const unavailable = '**/v1/support/capabilities';
    await page.route(unavailable, (r) => r.fulfill({ status: 503, contentType: 'application/json', body: JSON.stringify({ error: { type: 'platform.unavailable', message: 'restarting' } }) }));
    await page.reload();
    const notice = page.locator('[data-testid="unreachable"]');
    await notice.getByRole('alert').getByText('platform.unavailable').waitFor();
    expect(String(await stored())).toContain(key.secret);
    // No answer at all is the same.
    await page.unroute(unavailable);
    await page.route(unavailable, (r) => r.abort('connectionrefused'));
    await notice.getByRole('button', { name: 'Try again' }).click();
    await notice.getByRole('alert').getByText('Failed to fetch').waitFor();
    expect(String(await stored())).toContain(key.secret);
    // Once the API answers again, trying again signs the tab back in.
    await page.unroute(unavailable);
    await notice.getByRole('button', { name: 'Try again' }).click();
    await page.getByRole('heading', { name: 'Sessions', level: 1 }).waitFor();

    // A revoked credential is refused (401): the reload forgets it and asks for another.
    await p.root.post(`/v1/api-keys/${key.id}/revoke`, {});
    await page.reload();
    await page.getByLabel('Credential').waitFor();
    expect(await stored()).toBeNull();
  });
});

describe('console author across Workspaces', () => {
  it('an author remembered from another Workspace of the tab is replaced by one of this Workspace', async () => {
    const ws1 = p.bootstrap.workspace_id;
    const ws2 = (await p.root.post<{ id: string }>(`/v1/organizations/${p.bootstrap.organization_id}/workspaces`, { name: 'second' })).id;
    const s1 = await sessionIn(ws1, 'alice');
    const s2 = await sessionIn(ws2, 'bob');
    const { page } = b;
    await signIn(p.bootstrap.root_key);
    await page.goto(`${p.baseUrl}/console/#/sessions/${s1}`);
    await page.locator('[data-stream-state="live"]').waitFor();
    await expect.poll(() => page.locator('#author').inputValue()).toMatch(/^prin_/);
    const first = await page.locator('#author').inputValue();

    // Sign out, and in again in the second Workspace, in the same tab.
    await page.getByRole('button', { name: 'Sign out' }).click();
    await signIn(p.bootstrap.root_key, ws2);
    await page.goto(`${p.baseUrl}/console/#/sessions/${s2}`);
    await page.locator('[data-stream-state="live"]').waitFor();
    const bob = (await p.root.get<{ data: { id: string }[] }>(`/v1/organizations/workspaces/${ws2}/principals`)).data.map((x) => x.id);
    await expect.poll(() => page.locator('#author').inputValue()).toBe(bob[0]);
    expect(bob).not.toContain(first);
    // What the picker shows is who the message is sent as: it is accepted.
    await page.getByLabel('Message').fill('hello from the second workspace');
    const answer = page.waitForResponse((r) => r.request().method() === 'POST' && new URL(r.url()).pathname === `/v1/sessions/${s2}/events`);
    await page.getByRole('button', { name: 'Send' }).click();
    const sent = await answer;
    expect(sent.status()).toBe(201);
    expect((sent.request().postDataJSON() as { payload: { authored_by: string } }).payload.authored_by).toBe(bob[0]);
    await page.locator('li[data-type="user.message"]').filter({ hasText: 'hello from the second workspace' }).waitFor();
    expect(await page.locator('form.composer [role="alert"]').count()).toBe(0);
  });

  it('logged no error beyond the refusals the steps caused', () => {
    // The deliberate 503, the refused connection and the revoked key's 401 are the only failures.
    expect(b.errors.filter((e) => !/\b(401|503)\b/.test(e) && !e.includes('ERR_CONNECTION_REFUSED') && !e.includes('Failed to fetch'))).toEqual([]);
  });
});

describe('console pickers', () => {
  it('offer every Principal of the Workspace, past the first page of the list', async () => {
    const ws = (await p.root.post<{ id: string }>(`/v1/organizations/${p.bootstrap.organization_id}/workspaces`, { name: 'many' })).id;
    const s = await sessionIn(ws, 'first-author');
    // More than one page of the list at its largest limit (100), created in order.
    const made: string[] = [];
    for (let i = 0; i < 120; i += 20) {
      made.push(...(await Promise.all(Array.from({ length: 20 }, (_, k) => p.root.post<{ id: string }>(`/v1/organizations/workspaces/${ws}/principals`, {
        external_subject_id: `many-${i + k}`, principal_type: 'service', display_name: `many-${i + k}`,
      }).then((x) => x.id)))));
    }
    const last = made[made.length - 1] as string;
    const { page } = b;
    await signIn(p.bootstrap.root_key, ws);
    await page.goto(`${p.baseUrl}/console/#/sessions/${s}`);
    await page.locator('[data-stream-state="live"]').waitFor();
    await expect.poll(() => page.locator('#author option').count()).toBe(121);
    await page.locator('#author').selectOption(last);
    expect(await page.locator('#author').inputValue()).toBe(last);
    await page.goto(`${p.baseUrl}/console/#/runners`);
    await expect.poll(() => page.locator('#pair-principal option').count()).toBe(121);
    await page.locator('#pair-principal').selectOption(last);
    expect(await page.locator('#pair-principal').inputValue()).toBe(last);
  });

  it('the Sessions list reads older pages on demand', async () => {
    const ws = (await p.root.post<{ id: string }>(`/v1/organizations/${p.bootstrap.organization_id}/workspaces`, { name: 'older' })).id;
    const opts = { headers: { 'service-workspace-id': ws } };
    const env = (await p.root.post<{ id: string }>('/v1/environments', { name: 'default', image: 'agentplane/sandbox:1' }, opts)).id;
    const agent = (await p.root.post<{ id: string }>('/v1/agents', { name: 'a', model: 'default' }, opts)).id;
    const made: string[] = [];
    for (let i = 0; i < 120; i += 20) {
      made.push(...(await Promise.all(Array.from({ length: 20 }, () => p.root.post<{ id: string }>('/v1/sessions', { agent, environment_id: env }, opts).then((x) => x.id)))));
    }
    const { page } = b;
    await signIn(p.bootstrap.root_key, ws);
    const rows = page.locator('table[aria-label="Sessions"] tr[data-session-id]');
    await expect.poll(() => rows.count()).toBe(100);
    await page.getByRole('button', { name: 'Show older sessions' }).click();
    await expect.poll(() => rows.count()).toBe(120);
    // Every Session once, and the last page read: nothing older to show.
    const shown = await rows.evaluateAll((trs) => trs.map((tr) => tr.getAttribute('data-session-id')));
    expect(new Set(shown)).toEqual(new Set(made));
    expect(await page.getByRole('button', { name: 'Show older sessions' }).count()).toBe(0);
  });

  it('the Runners page lists every pool, past the first page of the list', async () => {
    const ws = (await p.root.post<{ id: string }>(`/v1/organizations/${p.bootstrap.organization_id}/workspaces`, { name: 'pools' })).id;
    const opts = { headers: { 'service-workspace-id': ws } };
    for (let i = 0; i < 105; i += 21) {
      await Promise.all(Array.from({ length: 21 }, (_, k) => p.root.post('/v1/runner-pools', { name: `pool-${i + k}`, placement: 'managed' }, opts)));
    }
    const { page } = b;
    await signIn(p.bootstrap.root_key, ws);
    await page.goto(`${p.baseUrl}/console/#/runners`);
    // The 105 made and the Workspace's default pool.
    await expect.poll(() => page.locator('table[aria-label="Runner pools"] tr[data-pool-id]').count()).toBe(106);
  });
});
