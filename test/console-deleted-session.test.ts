/**
 * The console on a Session deleted while its page is open (headless Chromium): the stream's
 * closing `gap` frame (reason erased) stops it and the page says the Session was deleted,
 * instead of reconnecting for ever.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
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

describe('console on a deleted Session', () => {
  it('stops streaming and shows the Session is gone', async () => {
    const env = (await p.root.post<{ id: string }>('/v1/environments', { name: 'default', image: 'agentplane/sandbox:1' })).id;
    const agent = (await p.root.post<{ id: string }>('/v1/agents', { name: 'a', model: 'default' })).id;
    const s = (await p.root.post<{ id: string }>('/v1/sessions', { agent, environment_id: env })).id;
    const { page } = b;
    page.setDefaultTimeout(20_000);
    await page.goto(`${p.baseUrl}/console/`);
    await page.getByLabel('Credential').fill(p.bootstrap.root_key);
    await page.getByRole('button', { name: 'Sign in' }).click();
    await page.getByRole('heading', { name: 'Sessions', level: 1 }).waitFor();
    await page.goto(`${p.baseUrl}/console/#/sessions/${s}`);
    const badge = page.locator('[data-stream-state]');
    await page.locator('[data-stream-state="live"]').waitFor();
    const streamRequests = () => b.requests.filter((u) => u.includes(`/v1/sessions/${s}/events/stream`)).length;
    const before = streamRequests();
    expect((await p.root.request('DELETE', `/v1/sessions/${s}`)).status).toBe(200);
    await page.locator('[data-stream-state="deleted"]').waitFor();
    await expect.poll(() => page.locator('body').innerText()).toMatch(/deleted/i);
    // Stopped: no reconnect followed the closing frame, and the page stays so.
    expect(streamRequests()).toBe(before);
    expect(await badge.getAttribute('data-reconnects')).toBe('0');
  }, 120_000);
});
