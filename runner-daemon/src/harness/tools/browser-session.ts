/**
 * One browser for one Run: a headless Chromium inside the Session's sandbox, driven over the
 * DevTools protocol with playwright-core. How the protocol reaches the browser is the
 * launcher's business (split topology: an exec's stdio bridged by the runner; colocated: a
 * local pipe inside the sandbox); this class keeps one page, hands out element references from
 * accessibility snapshots, and turns a dead browser or a crashed page into a clear error for the
 * call that met it, starting afresh on the next call.
 */
import type { Browser, Page } from 'playwright-core';

/** Chromium's flags in the sandbox: no network to reach, no GPU, no setuid sandbox (the container is the sandbox). */
export const CHROMIUM_FLAGS = [
  '--headless',
  '--no-sandbox',
  '--disable-gpu',
  '--disable-dev-shm-usage',
  '--no-first-run',
  '--no-default-browser-check',
  '--disable-background-networking',
  '--disable-component-update',
  '--disable-sync',
  '--disable-breakpad',
  '--disable-features=Translate,MediaRouter,OptimizationHints,DialMediaRouteProvider',
  '--mute-audio',
  '--hide-scrollbars',
];

/** The page size screenshots have (CSS pixels, scale 1). */
export const VIEWPORT = { width: 1280, height: 720 } as const;

/** PNG width and height from its IHDR chunk (undefined: not a PNG). */
export function pngSize(data: Buffer): { width: number; height: number } | undefined {
  if (data.length < 24 || data.readUInt32BE(0) !== 0x89504e47 || data.toString('ascii', 12, 16) !== 'IHDR') return undefined;
  return { width: data.readUInt32BE(16), height: data.readUInt32BE(20) };
}

/** A connected browser and how to let it go. */
export interface LaunchedBrowser {
  browser: Browser;
  /** Ends the browser and every process it started. */
  close(): Promise<void>;
  /** The last lines Chromium wrote on stderr (for a crash report). */
  diagnostics?(): string;
  /** Why the launcher itself ended the browser, once it did (e.g. its pipe broke a bound). */
  failure?(): string | undefined;
}

export type BrowserLauncher = () => Promise<LaunchedBrowser>;

/** The browser (or its page) died while a call used it; the next call starts a new one. */
export class BrowserCrashError extends Error {
  constructor(message: string) {
    super(message);
    this.name = 'BrowserCrashError';
  }
}

/** The Run was interrupted while a browser call ran. */
export class BrowserInterrupted extends Error {
  constructor() {
    super('interrupted');
    this.name = 'BrowserInterrupted';
  }
}

export class BrowserSession {
  private launched: LaunchedBrowser | null = null;
  private starting: Promise<LaunchedBrowser> | null = null;
  private current: Page | null = null;
  /** Why the browser or page died, set by its events; read by the call that was using it. */
  private death: string | null = null;
  private deathWaiters: Array<(why: string) => void> = [];
  private closed = false;

  constructor(private readonly launch: BrowserLauncher) {}

  /** Whether a browser is running now. */
  get running(): boolean {
    return this.launched !== null;
  }

  private died(why: string): void {
    if (this.death) return;
    this.death = why;
    for (const w of this.deathWaiters.splice(0)) w(why);
  }

  private async ensure(): Promise<Page> {
    if (this.closed) throw new BrowserCrashError('the browser of this Run is closed');
    if (this.current && !this.death) return this.current;
    if (this.death) await this.reset();
    if (!this.launched) {
      this.starting ??= this.launch().finally(() => (this.starting = null));
      const launched = await this.starting;
      this.launched = launched;
      launched.browser.on('disconnected', () => this.died(launched.failure?.() ?? 'the browser process exited'));
    }
    const context = await this.launched.browser.newContext({ viewport: { ...VIEWPORT }, deviceScaleFactor: 1, acceptDownloads: false, serviceWorkers: 'block' });
    const page = await context.newPage();
    page.on('crash', () => this.died('the page crashed'));
    page.on('close', () => {
      if (this.current === page) this.current = null;
    });
    this.current = page;
    return page;
  }

  /** Drops the dead browser (its processes are killed) so that the next call starts a new one. */
  private async reset(): Promise<void> {
    const launched = this.launched;
    this.launched = null;
    this.current = null;
    this.death = null;
    if (launched) await launched.close().catch(() => undefined);
  }

  /**
   * Runs `op` on the page. A browser that dies meanwhile (or was found dead) ends the call with a
   * BrowserCrashError; the sandbox is untouched and the next call starts a new browser.
   */
  async use<T>(op: (page: Page) => Promise<T>, signal?: AbortSignal): Promise<T> {
    if (signal?.aborted) throw new BrowserInterrupted();
    let page: Page;
    try {
      page = await this.ensure();
    } catch (err) {
      const diag = this.launched?.diagnostics?.() ?? '';
      await this.reset();
      if (err instanceof BrowserCrashError) throw err;
      throw new BrowserCrashError(`the browser could not start: ${(err as Error).message.split('\n')[0]}${diag ? `\n${diag}` : ''}`);
    }
    // Interrupted while the browser or its page was starting: that event has fired already, and
    // the op is not begun.
    if (signal?.aborted) throw new BrowserInterrupted();
    let onDeath!: (why: string) => void;
    const death = new Promise<never>((_, reject) => {
      onDeath = (why) => reject(new BrowserCrashError(why));
    });
    death.catch(() => undefined);
    this.deathWaiters.push(onDeath);
    let onAbort: (() => void) | undefined;
    const aborted = new Promise<never>((_, reject) => {
      onAbort = () => reject(new BrowserInterrupted());
      signal?.addEventListener('abort', onAbort, { once: true });
    });
    aborted.catch(() => undefined);
    try {
      return await Promise.race([op(page), death, aborted]);
    } catch (err) {
      if (err instanceof BrowserInterrupted) throw err;
      if (this.death || err instanceof BrowserCrashError) {
        const why = this.death ?? (err as Error).message;
        await this.reset();
        throw new BrowserCrashError(`${why}; the sandbox is unaffected and the next browser call starts a new browser`);
      }
      throw err;
    } finally {
      this.deathWaiters = this.deathWaiters.filter((w) => w !== onDeath);
      if (onAbort) signal?.removeEventListener('abort', onAbort);
    }
  }

  /** Ends the browser (at the end of the Run). */
  async close(): Promise<void> {
    this.closed = true;
    if (this.starting) await this.starting.then((l) => (this.launched ??= l), () => undefined);
    await this.reset();
  }
}
