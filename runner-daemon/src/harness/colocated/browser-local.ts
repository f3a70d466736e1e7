/**
 * The colocated harness's browser: Chromium launched by playwright-core inside the sandbox, on a
 * local DevTools pipe (no port, no network). playwright-core comes from the browser image
 * (`/opt/agentplane/node_modules`), loaded only when a browser tool is used, so the harness
 * bundle stays self-contained.
 */
import { createRequire } from 'node:module';
import type { BrowserType } from 'playwright-core';
import { CHROMIUM_FLAGS, type LaunchedBrowser } from '../tools/browser-session.js';

/** Where the browser image keeps Chromium and playwright-core (see sandbox/browser-image.ts). */
const CHROMIUM = '/usr/lib/chromium/chromium';
const MODULES = '/opt/agentplane/node_modules/';

export async function launchLocal(timeoutMs = 30_000): Promise<LaunchedBrowser> {
  let chromium: BrowserType;
  try {
    ({ chromium } = createRequire(MODULES)('playwright-core') as { chromium: BrowserType });
  } catch (err) {
    throw new Error(`this sandbox image has no playwright-core at ${MODULES} (browser Environments run the browser image): ${(err as Error).message.split('\n')[0]}`);
  }
  const browser = await chromium.launch({ executablePath: CHROMIUM, args: CHROMIUM_FLAGS, headless: true, timeout: timeoutMs });
  return { browser, close: () => browser.close().catch(() => undefined) };
}
