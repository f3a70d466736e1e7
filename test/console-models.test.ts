/**
 * The web console's Models page in a real headless Chromium: a workspace with more model
 * credentials and routing profiles than one page of a list (20) shows every one of them.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { launchBrowser, type TestBrowser } from './harness/browser.js';
import { startPlatform, type Platform } from './harness/platform.js';

let p: Platform;
let b: TestBrowser;
const COUNT = 23;

beforeAll(async () => {
  p = await startPlatform({});
  const ws = p.bootstrap.workspace_id;
  for (let i = 0; i < COUNT; i++) {
    const key = `cred-${String(i).padStart(2, '0')}`;
    await p.root.post(`/v1/organizations/workspaces/${ws}/model-credentials`, { key, provider_key: 'openai', base_url: 'http://127.0.0.1:11434/v1' });
    await p.root.post(`/v1/organizations/workspaces/${ws}/model-routing-profiles`, { key: `profile-${String(i).padStart(2, '0')}`, candidates: [{ credential_key: key, provider_model: 'm' }] });
  }
  b = await launchBrowser();
  b.page.setDefaultTimeout(30_000);
}, 120_000);

afterAll(async () => {
  await b?.close();
  await p?.stop();
});

/** Every item of a list, through its pages. */
async function all(path: string): Promise<{ key: string }[]> {
  const out: { key: string }[] = [];
  let page: string | undefined;
  do {
    const r = await p.root.get<{ data: { key: string }[]; next_page?: string | null }>(path, { limit: 100, page });
    out.push(...r.data);
    page = r.next_page ?? undefined;
  } while (page);
  return out;
}

describe('console Models page', () => {
  it('lists every model credential and routing profile, past the first page of each list', async () => {
    const ws = p.bootstrap.workspace_id;
    const creds = await all(`/v1/organizations/workspaces/${ws}/model-credentials`);
    const profiles = await all(`/v1/organizations/workspaces/${ws}/model-routing-profiles`);
    expect(creds.length).toBeGreaterThan(20);
    expect(profiles.length).toBeGreaterThan(20);

    const { page } = b;
    await page.goto(`${p.baseUrl}/console/`);
    await page.getByLabel('Credential').fill(p.bootstrap.root_key);
    await page.getByRole('button', { name: 'Sign in' }).click();
    await page.getByRole('heading', { name: 'Sessions', level: 1 }).waitFor();
    await page.goto(`${p.baseUrl}/console/#/models`);
    const credRows = page.getByRole('table', { name: 'Model credentials' }).locator('tbody tr');
    const profileRows = page.getByRole('table', { name: 'Routing profiles' }).locator('tbody tr');
    // The last of each (in the API's order) is on the page: the lists are read to their end.
    await credRows.filter({ hasText: creds.at(-1)?.key ?? '' }).waitFor();
    await profileRows.filter({ hasText: profiles.at(-1)?.key ?? '' }).waitFor();
    expect(await credRows.count()).toBe(creds.length);
    expect(await profileRows.count()).toBe(profiles.length);
    for (const c of creds) await expect(credRows.filter({ hasText: c.key }).count()).resolves.toBeGreaterThan(0);
  }, 60_000);
});
