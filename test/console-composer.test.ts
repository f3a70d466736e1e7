/**
 * The Session page's composer in headless Chromium: Ctrl+Enter pressed again while a message is
 * still being sent does not send it a second time (the Send button is disabled then; the shortcut
 * must respect that too).
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { Route } from 'playwright-core';
import { startPlatform, type Platform } from './harness/platform.js';
import { launchBrowser, type TestBrowser } from './harness/browser.js';

let p: Platform;
let b: TestBrowser;

beforeAll(async () => {
  p = await startPlatform();
  b = await launchBrowser();
}, 120_000);
afterAll(async () => {
  await b?.close();
  await p?.stop();
});

describe('console composer', () => {
  it('Ctrl+Enter twice while the first send is in flight sends one user.message', async () => {
    const ws = p.bootstrap.workspace_id;
    await p.root.post(`/v1/organizations/workspaces/${ws}/principals`, { external_subject_id: 'me', principal_type: 'person', display_name: 'Me' });
    const env = (await p.root.post<{ id: string }>('/v1/environments', { name: 'default', image: 'agentplane/sandbox:1' })).id;
    const s = (await p.root.post<{ id: string }>('/v1/sessions', { agent: { name: 'a', model: 'default' }, environment_id: env })).id;
    const { page } = b;
    page.setDefaultTimeout(20_000);
    await page.goto(`${p.baseUrl}/console/`);
    await page.getByLabel('Credential').fill(p.bootstrap.root_key);
    await page.getByRole('button', { name: 'Sign in' }).click();
    await page.getByRole('heading', { name: 'Sessions', level: 1 }).waitFor();
    await page.goto(`${p.baseUrl}/console/#/sessions/${s}`);
    await page.locator('[data-stream-state="live"]').waitFor();
    await page.locator('select#author option').first().waitFor({ state: 'attached' });

    // The first send is held until the second Ctrl+Enter was pressed.
    let release!: () => void;
    const held = new Promise<void>((r) => (release = r));
    let posts = 0;
    await page.route(`**/v1/sessions/${s}/events`, async (route: Route) => {
      if (route.request().method() !== 'POST') return route.continue();
      posts += 1;
      if (posts === 1) await held;
      return route.continue();
    });
    const box = page.getByLabel('Message');
    await box.fill('hello once');
    await box.press('Control+Enter');
    await page.getByRole('button', { name: 'Send' }).and(page.locator('[disabled]')).waitFor();
    await box.press('Control+Enter');
    release();
    await page.locator('li[data-type="user.message"]').first().waitFor();
    await expect.poll(() => box.inputValue()).toBe('');
    await page.unroute(`**/v1/sessions/${s}/events`);

    const thread = (await p.root.get<{ data: { id: string }[] }>(`/v1/sessions/${s}/threads`)).data[0]?.id ?? '';
    const events = (await p.root.get<{ data: { type: string }[] }>(`/v1/sessions/${s}/threads/${thread}/events`, { limit: 1000 })).data;
    expect(events.filter((e) => e.type === 'user.message')).toHaveLength(1);
    expect(posts).toBe(1);
  }, 120_000);
});
