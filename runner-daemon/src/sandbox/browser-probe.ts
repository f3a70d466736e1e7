/**
 * The browser canary: `browser_observation` is claimed only after a sandbox of the browser
 * image, started like any Session's (no network, non-root, read-only root, limits), ran
 * Chromium through the runner's bridge, read a page's accessibility tree with element
 * references and took a PNG screenshot of it, under every isolation tier the runner verified (the
 * claim is the provider's, so it must hold for each tier it lists). The probe runs again when the
 * image or the tiers change (read on every refresh), so a removed or rebuilt image changes the
 * claim.
 */
import { randomBytes } from 'node:crypto';
import type Docker from 'dockerode';
import { launchInSandbox } from './browser.js';
import { pngSize, VIEWPORT } from '../harness/tools/browser-session.js';
import type { SandboxDriver, SandboxTier } from './types.js';

export interface BrowserVerdict {
  accessibility_tree: boolean;
  screenshot: boolean;
  detail: string;
  ms: number;
}

const CANARY_PAGE = 'data:text/html,<title>canary</title><button>probe</button>';

export class BrowserProbe {
  private verdict: BrowserVerdict | undefined;
  private signature = '';
  private running: Promise<BrowserVerdict> | null = null;

  constructor(
    private readonly docker: Docker,
    private readonly image: () => Promise<string | undefined>,
    private readonly driver: Pick<SandboxDriver, 'ensure' | 'spawn' | 'destroy'>,
    /** The isolation tiers the runner verified (each gets a canary browser). */
    private readonly tiers: () => Promise<SandboxTier[]> = async () => ['container'],
  ) {}

  last(): BrowserVerdict | undefined {
    return this.verdict;
  }

  async verified(): Promise<BrowserVerdict> {
    if (this.running) return this.running;
    this.running = this.refresh().finally(() => (this.running = null));
    return this.running;
  }

  private async refresh(): Promise<BrowserVerdict> {
    const started = Date.now();
    let imageId: string;
    let tiers: SandboxTier[];
    try {
      tiers = await this.tiers();
      if (tiers.length === 0) throw new Error('no isolation tier is verified on this runner');
      const image = await this.image();
      if (!image) throw new Error('the browser image is not present and cannot be built here');
      imageId = ((await this.docker.getImage(image).inspect()) as { Id: string }).Id;
    } catch (err) {
      this.signature = '';
      this.verdict = { accessibility_tree: false, screenshot: false, detail: err instanceof Error ? err.message : String(err), ms: Date.now() - started };
      return this.verdict;
    }
    const signature = JSON.stringify({ imageId, tiers });
    if (signature === this.signature && this.verdict) return this.verdict;
    const verdicts: BrowserVerdict[] = [];
    for (const tier of tiers) verdicts.push(await this.canary(started, tier));
    this.verdict = {
      accessibility_tree: verdicts.every((v) => v.accessibility_tree),
      screenshot: verdicts.every((v) => v.screenshot),
      detail: verdicts.map((v, i) => `${tiers[i]}: ${v.detail}`).join('; '),
      ms: Date.now() - started,
    };
    this.signature = signature;
    return this.verdict;
  }

  private async canary(started: number, tier: SandboxTier): Promise<BrowserVerdict> {
    const session = { id: `browser-canary-${randomBytes(6).toString('hex')}` };
    let tree = false;
    let shot = false;
    let detail = 'canary browser ran';
    try {
      const sandbox = await this.driver.ensure(session, { browser: true, network_mode: 'none', tier });
      const launched = await launchInSandbox(this.driver, sandbox, { timeoutMs: 30_000 });
      try {
        const context = await launched.browser.newContext({ viewport: { ...VIEWPORT } });
        const page = await context.newPage();
        await page.goto(CANARY_PAGE, { timeout: 15_000 });
        tree = /button "probe" \[ref=e\d+\]/.test(await page.ariaSnapshot({ mode: 'ai', timeout: 10_000 }));
        const size = pngSize(await page.screenshot({ type: 'png', timeout: 10_000 }));
        shot = size?.width === VIEWPORT.width && size.height === VIEWPORT.height;
        if (!tree || !shot) detail = `canary page: accessibility tree ${tree ? 'ok' : 'missing'}, screenshot ${shot ? 'ok' : 'wrong'}`;
      } finally {
        await launched.close();
      }
    } catch (err) {
      detail = `canary browser failed: ${err instanceof Error ? err.message.split('\n')[0] : String(err)}`;
    } finally {
      await this.driver.destroy(session.id).catch(() => undefined);
    }
    return { accessibility_tree: tree, screenshot: shot, detail, ms: Date.now() - started };
  }
}
