import { EventEmitter } from 'node:events';
import type { Browser, Page } from 'playwright-core';
import { describe, expect, it } from 'vitest';
import { BrowserInterrupted, BrowserSession, type LaunchedBrowser } from './browser-session.js';

/** A browser that starts in one turn of the event loop, with one page: enough for `use`. */
function fakeLauncher(): () => Promise<LaunchedBrowser> {
  return async () => {
    await new Promise((r) => setImmediate(r));
    const page = new EventEmitter() as unknown as Page;
    const browser = Object.assign(new EventEmitter(), {
      newContext: async () => ({ newPage: async () => page }),
    }) as unknown as Browser;
    return { browser, close: async () => undefined };
  };
}

describe('BrowserSession.use', () => {
  it('an interrupt that comes while the browser starts ends the call as interrupted', async () => {
    const session = new BrowserSession(fakeLauncher());
    const controller = new AbortController();
    let ran = false;
    // The op would answer as soon as it runs: only the interrupt can make the call throw.
    const call = session.use(async () => {
      ran = true;
      return 'done';
    }, controller.signal);
    controller.abort();
    await expect(call).rejects.toBeInstanceOf(BrowserInterrupted);
    expect(ran).toBe(false);
    await session.close();
  });

  it('a call without an interrupt runs the op on the page', async () => {
    const session = new BrowserSession(fakeLauncher());
    expect(await session.use(async () => 'done', new AbortController().signal)).toBe('done');
    await session.close();
  });
});
