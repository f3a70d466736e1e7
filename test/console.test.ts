/**
 * The web console in a real headless Chromium against a platform started like `npm start`
 * (scheduler and local runner): sign in, create a Session, send a message and watch the turn
 * stream in and end, interrupt a long turn, answer an ask_user question, drain and resume a
 * runner pool, create a pairing code, and a dropped stream that resumes with Last-Event-ID and
 * no duplicate. Screenshots of every page land in test-output/console/.
 */
import { mkdirSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import type { Page } from 'playwright-core';
import { ROOT_DIR } from './harness/platform.js';
import { launchBrowser, type TestBrowser } from './harness/browser.js';
import { startTcpProxy, type TcpProxy } from './harness/tcp-proxy.js';
import { SCRIPT, startTurnPlatform, type TurnPlatform } from './harness/turns.js';

const SHOTS = join(ROOT_DIR, 'test-output', 'console');
mkdirSync(SHOTS, { recursive: true });

let t: TurnPlatform;
let proxy: TcpProxy;
let b: TestBrowser;
let page: Page;
let key: string;
let firstSession = '';

const shot = (name: string, full = true) => page.screenshot({ path: join(SHOTS, `${name}.png`), fullPage: full });

beforeAll(async () => {
  t = await startTurnPlatform({ name: 'console' });
  // An admin key of the workspace: it may drive Sessions and operate runner pools.
  key = (await t.p.root.post<{ secret: string }>(`/v1/organizations/${t.p.bootstrap.organization_id}/api-keys`, {
    display_name: 'console', role: 'admin', scope: { type: 'workspace', workspace_id: t.p.bootstrap.workspace_id },
  }, { idempotencyKey: 'console-admin-key' })).secret;
  proxy = await startTcpProxy(t.p.port);
  b = await launchBrowser();
  page = b.page;
  page.setDefaultTimeout(30_000);
}, 240_000);

// A failing step leaves a picture of the page behind.
afterEach(async (c) => {
  if (c.task.result?.state === 'fail' && page) await shot(`failed-${c.task.name.replace(/[^a-z0-9]+/gi, '-').slice(0, 60)}`).catch(() => undefined);
});

afterAll(async () => {
  await b?.close();
  await proxy?.close();
  await t?.p.stop();
});

describe('serving', () => {
  it('serves the console without a credential, with a strict CSP and cache headers', async () => {
    const base = t.p.baseUrl;
    const redirect = await fetch(`${base}/console`, { redirect: 'manual' });
    expect(redirect.status).toBe(308);
    expect(redirect.headers.get('location')).toBe('/console/');
    const index = await fetch(`${base}/console/`);
    expect(index.status).toBe(200);
    expect(index.headers.get('content-type')).toContain('text/html');
    const csp = index.headers.get('content-security-policy') ?? '';
    expect(csp).toContain("default-src 'self'");
    expect(csp).toContain("script-src 'self'");
    expect(csp).not.toContain('unsafe-inline');
    expect(index.headers.get('cache-control')).toBe('no-cache');
    const html = await index.text();
    expect(html).not.toMatch(/<script>(?!<)/); // no inline script
    const js = /src="(assets\/app-[^"]+\.js)"/.exec(html)?.[1];
    expect(js).toBeTruthy();
    const asset = await fetch(`${base}/console/${js}`);
    expect(asset.status).toBe(200);
    expect(asset.headers.get('cache-control')).toContain('immutable');
    const again = await fetch(`${base}/console/${js}`, { headers: { 'if-none-match': asset.headers.get('etag') ?? '' } });
    expect(again.status).toBe(304);
    // A cache holding several versions sends them all (RFC 9110): one of them matching is enough.
    const listed = await fetch(`${base}/console/${js}`, { headers: { 'if-none-match': `"stale", W/${asset.headers.get('etag') ?? ''}` } });
    expect(listed.status).toBe(304);
    expect((await fetch(`${base}/console/${js}`, { headers: { 'if-none-match': '"stale"' } })).status).toBe(200);
    expect((await fetch(`${base}/console/nope.js`)).status).toBe(404);
    expect((await fetch(`${base}/console/`, { method: 'POST' })).status).toBe(405);
  });
});

describe('in the browser', () => {
  it('rejects a wrong credential, then signs in with an API key kept in session storage only', async () => {
    await page.goto(`${proxy.url}/console/`);
    await shot('signin', false);
    // A Principal access credential signs in too; the pages show what it may not read.
    const cred = await t.p.root.request<{ secret: string }>('POST', `/v1/principals/${t.principal}/access-credentials`, { body: {}, idempotencyKey: 'console-cred' });
    expect(cred.status).toBe(201);
    await page.getByLabel('Credential').fill(cred.body.secret);
    await page.getByRole('button', { name: 'Sign in' }).click();
    await page.getByRole('heading', { name: 'Sessions', level: 1 }).waitFor();
    await expect.poll(() => page.getByRole('alert').first().textContent()).toContain('policy.denied');
    await page.getByRole('button', { name: 'Sign out' }).click();
    await page.getByLabel('Credential').fill('ap_key_not_a_real_key_000000');
    await page.getByRole('button', { name: 'Sign in' }).click();
    await expect.poll(() => page.getByRole('alert').textContent()).toContain('auth.invalid_key');
    await page.getByLabel('Credential').fill(key);
    await page.getByRole('button', { name: 'Sign in' }).click();
    await page.getByRole('heading', { name: 'Sessions', level: 1 }).waitFor();
    expect(page.url()).not.toContain(key);
    const stored = await page.evaluate('sessionStorage.getItem("agentplane.console.auth")');
    expect(String(stored)).toContain(key);
    // The workspace the API resolved is shown.
    await page.getByText(t.p.bootstrap.workspace_id).waitFor();
    // A reload keeps the sign-in (same tab).
    await page.reload();
    await page.getByRole('heading', { name: 'Sessions', level: 1 }).waitFor();
  });

  it('creates a Session, sends a message, and watches the turn stream in and end', async () => {
    await page.getByRole('button', { name: 'New session' }).click();
    await page.getByLabel('Title').fill('console demo');
    await page.getByLabel('Name').fill('scripted');
    // (~~~ fences: a ``` inside the reply would close the script's own fenced block.)
    await page.getByLabel('System prompt').fill(SCRIPT([
      { when: { user_contains: 'code' }, then: [{ think: 'They want code.' }, { reply: 'Here you go:\n\n~~~js\nconsole.log("hi")\n~~~\n\nDone **now**.' }] },
      { then: [{ reply: 'You said: {{user}}' }] },
    ]));
    await page.getByRole('button', { name: 'Create session' }).click();
    await page.waitForURL(/#\/sessions\/sess_/);
    firstSession = /sess_[0-9a-f]{32}/.exec(page.url())?.[0] ?? '';
    expect(firstSession).toMatch(/^sess_/);
    await page.locator('[data-stream-state="live"]').waitFor();

    await page.getByLabel('Message').fill('show me code');
    await page.getByRole('button', { name: 'Send' }).click();
    await page.locator('li[data-type="user.message"]').filter({ hasText: 'show me code' }).waitFor();
    const reply = page.locator('li[data-type="agent.message"]').filter({ hasText: 'Here you go' });
    await reply.waitFor({ timeout: 120_000 }); // the first turn of a platform also starts its sandbox
    await page.locator('[data-stop-reason="end_turn"]').waitFor();
    // Markdown: a code block and bold text, rendered as elements.
    expect(await reply.locator('pre.code code').textContent()).toBe('console.log("hi")');
    expect(await reply.locator('strong').textContent()).toBe('now');
    // Thinking is collapsed.
    const thinking = page.locator('li[data-type="agent.thinking"] details');
    expect(await thinking.getAttribute('open')).toBeNull();
    // Usage shows up once the turn is metered.
    await expect.poll(async () => Number((await page.locator('[data-testid="usage"] dd').first().textContent()) ?? 0)).toBeGreaterThan(0);

    // Raw HTML in a message is text, never markup.
    await page.getByLabel('Message').fill('<img src=x id=injected> <script>1</script>');
    await page.getByRole('button', { name: 'Send' }).click();
    await page.locator('li[data-type="agent.message"]').filter({ hasText: 'You said: <img src=x id=injected>' }).waitFor();
    expect(await page.locator('#injected').count()).toBe(0);
    await page.locator('[data-stop-reason="end_turn"]').waitFor();
    await shot('session');

    // The Sessions list shows it.
    await page.getByRole('link', { name: 'Sessions' }).click();
    await page.locator(`tr[data-session-id="${firstSession}"]`).waitFor();
    await shot('sessions');
  }, 180_000);

  it('shows the Run timeline with every phase and its attempt', async () => {
    await page.goto(`${proxy.url}/console/#/sessions/${firstSession}`);
    await page.locator('aside a[href^="#/runs/"]').first().click();
    await page.getByRole('heading', { name: 'Run', level: 1 }).waitFor();
    for (const phase of ['accepted_at', 'enqueued_at', 'leased_at', 'started_at', 'first_event_at', 'ended_at']) {
      await page.locator(`li[data-phase="${phase}"]:not(.pending)`).waitFor();
    }
    const runner = await page.locator('table[aria-label="Attempts"] tbody td.mono').first().textContent();
    expect(runner).toMatch(/^runner_/);
    await shot('run');
  });

  it('resumes a dropped stream with Last-Event-ID and shows no event twice', async () => {
    await page.goto(`${proxy.url}/console/#/sessions/${firstSession}`);
    await page.locator('[data-stream-state="live"]').waitFor();
    await page.locator('[data-stop-reason="end_turn"]').waitFor();
    const before = await page.locator('ol.conversation li[data-seq]').count();
    const lastSeq = Number(await page.locator('ol.conversation li[data-seq]').last().getAttribute('data-seq'));
    const streamsBefore = proxy.heads.filter((h) => h.includes('/events/stream')).length;
    expect(proxy.dropAll()).toBeGreaterThan(0);
    await page.locator('[data-stream-state="live"]:not([data-reconnects="0"])').waitFor();
    // The reconnect carried the cursor.
    const resumed = proxy.heads.filter((h) => h.includes('/events/stream')).slice(streamsBefore);
    expect(resumed.some((h) => h.includes(`last-event-id: ${lastSeq}`))).toBe(true);
    // A new turn after the drop arrives once; nothing before it repeats.
    await t.api.post(`/v1/sessions/${firstSession}/events`, t.msg('after the drop'));
    await page.locator('li[data-type="agent.message"]').filter({ hasText: 'You said: after the drop' }).waitFor();
    const seqs = await page.locator('ol.conversation li[data-seq]').evaluateAll((els) => els.map((e) => e.getAttribute('data-seq')));
    expect(new Set(seqs).size).toBe(seqs.length);
    expect(seqs.length).toBeGreaterThan(before);
    expect(await page.locator('li[data-type="user.message"]').filter({ hasText: 'after the drop' }).count()).toBe(1);
  }, 120_000);

  it('interrupts a long turn', async () => {
    const s = await t.api.post<{ id: string }>('/v1/sessions', {
      agent: { name: 'sleeper', model: 'default', system: SCRIPT([{ when: { user_contains: 'sleep' }, then: [{ tool: 'bash', input: { command: 'sleep 600' } }] }]), tools: [{ type: 'builtin', name: 'bash' }] },
      environment_id: t.envId, title: 'long turn',
    });
    await page.goto(`${proxy.url}/console/#/sessions/${s.id}`);
    await page.locator('[data-stream-state="live"]').waitFor();
    await page.getByLabel('Message').fill('sleep please');
    await page.getByRole('button', { name: 'Send' }).click();
    await page.locator('li[data-type="agent.tool_use"]').filter({ hasText: 'bash' }).waitFor();
    const interrupt = page.getByRole('button', { name: 'Interrupt' });
    await expect.poll(() => interrupt.isEnabled()).toBe(true);
    await shot('session-running');
    await interrupt.click();
    await page.locator('[data-stop-reason="interrupted"]').waitFor({ timeout: 30_000 });
    await page.locator('li[data-type="user.interrupt"]').waitFor();
  }, 120_000);

  it('answers an ask_user question from its form, and drops the form of a wait an interrupt ended', async () => {
    const question = { questions: [{ question: 'Which colour?', options: ['red', 'blue'], allow_other: true }, { question: 'Why?' }] };
    const s = await t.api.post<{ id: string }>('/v1/sessions', {
      agent: {
        name: 'asker', model: 'default', tools: [{ type: 'builtin', name: 'ask_user' }],
        system: SCRIPT([
          { when: { user_contains: 'colour' }, then: [{ tool: 'ask_user', input: question }] },
          { when: { after_tool: 'ask_user' }, then: [{ reply: 'Noted. {{tool_result}}' }] },
        ]),
      },
      environment_id: t.envId, title: 'question',
    });
    await page.goto(`${proxy.url}/console/#/sessions/${s.id}`);
    await page.locator('[data-stream-state="live"]').waitFor();
    await page.getByLabel('Message').fill('pick a colour');
    await page.getByRole('button', { name: 'Send' }).click();
    const form = page.locator('li[data-type="agent.tool_use"] [data-testid="question-form"]');
    await form.waitFor({ timeout: 60_000 });
    await shot('session-question');
    // A choice and a free-text answer, sent as user.question_answer (a custom tool result is refused for a question).
    await form.getByRole('group', { name: 'Which colour?' }).getByLabel('blue').check();
    await form.getByRole('group', { name: 'Why?' }).getByLabel('Answer').fill('calm');
    await form.getByRole('button', { name: 'Send answers' }).click();
    await page.locator('li[data-type="user.question_answer"]').filter({ hasText: 'blue · calm' }).waitFor();
    // The agent read the answers and the form is gone.
    await page.locator('li[data-type="agent.message"]').filter({ hasText: 'Noted.' }).filter({ hasText: 'blue' }).filter({ hasText: 'calm' }).waitFor();
    expect(await form.count()).toBe(0);
    expect(await page.locator('form.composer [role="alert"]').count()).toBe(0);

    // A second question that the console's Interrupt ends while it waits (its tool use gets an
    // interrupted result): no form stays behind.
    await page.getByLabel('Message').fill('another colour');
    await page.getByRole('button', { name: 'Send' }).click();
    await form.waitFor({ timeout: 60_000 });
    const interrupt = page.waitForResponse((r) => r.request().method() === 'POST' && new URL(r.url()).pathname === `/v1/sessions/${s.id}/events`);
    await page.getByRole('button', { name: 'Interrupt' }).click();
    const sent = await interrupt;
    expect([sent.status(), (sent.request().postDataJSON() as { type: string }).type]).toEqual([201, 'user.interrupt']);
    await page.locator('li[data-type="agent.tool_result"]').nth(1).waitFor();
    await expect.poll(() => form.count()).toBe(0);
  }, 120_000);

  it('lists runners live, drains and resumes the pool and a single runner', async () => {
    await page.getByRole('link', { name: 'Runners' }).click();
    const row = page.locator('tr[data-runner-id]').first();
    await row.waitFor();
    await row.getByText('ready').waitFor();
    // The heartbeat column updates on its own.
    const seen = await row.locator('td[data-last-seen]').getAttribute('data-last-seen');
    await expect.poll(() => row.locator('td[data-last-seen]').getAttribute('data-last-seen'), { timeout: 15_000 }).not.toBe(seen);

    const pool = page.locator('tr[data-pool-id]').first();
    await pool.getByRole('button', { name: /^Drain pool/ }).click();
    await pool.getByText('draining', { exact: true }).waitFor();
    await shot('runners-draining');
    await pool.getByRole('button', { name: /^Resume pool/ }).click();
    await pool.getByText('active', { exact: true }).waitFor();
    const poolId = await pool.getAttribute('data-pool-id');
    const live = await t.p.root.get<{ status: string }>(`/v1/runner-pools/${poolId}`);
    expect(live.status).toBe('active');
    // The drained runner stayed connected: the pool's resume brings it back.
    await row.getByText('ready').waitFor({ timeout: 15_000 });

    // One runner on its own: drain, then resume.
    await row.getByRole('button', { name: /^Drain runner/ }).click();
    await row.getByText('draining', { exact: true }).waitFor({ timeout: 15_000 });
    await row.getByRole('button', { name: /^Resume runner/ }).click();
    await row.getByText('ready').waitFor({ timeout: 15_000 });
  }, 90_000);

  it('creates a pairing code shown once with the exact pair command', async () => {
    await page.getByLabel('Machine label').fill('laptop-from-console');
    await page.getByRole('button', { name: 'Create pairing code' }).click();
    const codeEl = page.locator('[data-pairing-code]');
    await codeEl.waitFor();
    const code = (await codeEl.getAttribute('data-pairing-code')) ?? '';
    expect(code.length).toBeGreaterThan(8);
    expect(await page.locator('[data-pair-command]').textContent()).toBe(`node runner-daemon/dist/cli.js pair --code ${code} --url ${proxy.url}`);
    await shot('runners');
    // The code is real: it redeems once.
    const redeemed = await t.p.anon.request('POST', '/v1/runner-pairings/redeem', { body: { code } });
    expect(redeemed.status).toBe(201);
  });

  it('shows models: credentials, routing profiles, usage chart and budget', async () => {
    await page.getByRole('link', { name: 'Models' }).click();
    await page.getByRole('heading', { name: 'Usage over time' }).waitFor();
    await page.locator('figure.chart rect.bar-fill:not([height="0"])').first().waitFor();
    // The built-in scripted model's credential head and its default routing profile.
    await page.locator('table[aria-label="Model credentials"] tbody tr').filter({ hasText: 'scripted' }).waitFor();
    await page.locator('table[aria-label="Routing profiles"] tbody tr').first().waitFor();
    await shot('models');
  });

  it('works at phone width without horizontal scrolling', async () => {
    await page.setViewportSize({ width: 390, height: 844 });
    for (const [name, hash] of [['phone-sessions', '#/sessions'], ['phone-session', `#/sessions/${firstSession}`], ['phone-runners', '#/runners']] as const) {
      await page.goto(`${proxy.url}/console/${hash}`);
      await page.locator('main h1').first().waitFor();
      if (name === 'phone-session') await page.locator('li[data-type="agent.message"]').first().waitFor();
      const overflow = await page.evaluate('document.documentElement.scrollWidth - document.documentElement.clientWidth');
      expect(Number(overflow), name).toBeLessThanOrEqual(0);
      await shot(name);
    }
    await page.setViewportSize({ width: 1280, height: 800 });
  }, 90_000);

  it('a Session that is not there is one message and a way back, not a working page', async () => {
    // Not a Session id at all: nothing is asked of the API.
    const requestsBefore = b.requests.length;
    await page.goto(`${proxy.url}/console/#/sessions/sess_doesnotexist`);
    await page.locator('[data-testid="session-missing"]').getByText('is not a Session id').waitFor();
    expect(b.requests.slice(requestsBefore).filter((u) => u.includes('/v1/sessions/'))).toEqual([]);
    // A well-formed id of no Session: its one read answers 404; no stream or side panel is opened.
    const missing = `sess_${'0'.repeat(32)}`;
    const errorsBefore = b.errors.length;
    await page.goto(`${proxy.url}/console/#/sessions/${missing}`);
    const view = page.locator('[data-testid="session-missing"]');
    await view.getByRole('link', { name: 'Back to Sessions' }).waitFor();
    expect(await page.locator('form.composer').count()).toBe(0);
    expect(b.requests.filter((u) => u.includes(`/v1/sessions/${missing}/`))).toEqual([]);
    // That one 404 is the only failure the page logs (taken out before the check below).
    await expect.poll(() => b.errors.length - errorsBefore, { timeout: 10_000 }).toBe(1);
    expect(b.errors.splice(errorsBefore)).toEqual([expect.stringMatching(/\b404\b/)]);
  });

  it('made no request to another origin and logged no error', () => {
    const foreign = b.requests.filter((u) => !u.startsWith(`${proxy.url}/`));
    expect(foreign).toEqual([]);
    // The Principal credential's refusals answer 403, the deliberate wrong key 401, and the
    // connections the proxy deliberately dropped end incomplete (the stream) or empty (a request
    // the page had in flight at that moment); nothing else may have failed
    // (CSP violations included).
    expect(b.errors.filter((e) => !/\b(401|403)\b/.test(e) && !/ERR_(INCOMPLETE_CHUNKED_ENCODING|EMPTY_RESPONSE)/.test(e))).toEqual([]);
  });
});
