/**
 * The browser tools (Environments with `browser: true`): navigate, click and type by element
 * reference, press keys, wait for text, read the accessibility tree, take a screenshot. The
 * browser runs inside the Session's sandbox, which has no network: pages come from the
 * workspace (`file://`) or from servers the agent started in the sandbox (`http://localhost`).
 * Snapshots follow Playwright MCP's shape: the page's URL and title, then its accessibility tree
 * as YAML with `[ref=eN]` element references that the next click or type names.
 */
import type { Page } from 'playwright-core';
import { BrowserCrashError, BrowserInterrupted, pngSize, VIEWPORT } from './browser-session.js';
import { capText, fields, ToolInputError, type BuiltinTool, type ToolContext, type ToolOutcome } from './types.js';

/** Characters of accessibility tree returned per snapshot. */
export const SNAPSHOT_MAX_CHARS = 20_000;
/** Bound on one browser action (navigation, click, wait). */
const ACTION_TIMEOUT_MS = 15_000;
const WAIT_MAX_MS = 60_000;
/** Largest screenshot sent to the model (a model request travels in one runner frame). */
const SCREENSHOT_MAX_BYTES = 600 * 1024;

const HOSTS = new Set(['localhost', '127.0.0.1', '[::1]']);

/** Only pages inside the sandbox: the workspace's files and servers on its loopback. */
export function allowedUrl(raw: string, workspace: string): string {
  let url: URL;
  try {
    url = new URL(raw.startsWith('/') ? `file://${raw}` : raw);
  } catch {
    throw new ToolInputError('browser_navigate', `not a URL: ${raw}`);
  }
  if (url.protocol === 'about:' && url.href === 'about:blank') return url.href;
  if (url.protocol === 'http:' || url.protocol === 'https:') {
    if (!HOSTS.has(url.hostname)) throw new ToolInputError('browser_navigate', `the browser has no network: only http://localhost (servers inside the sandbox) and file:// URLs under ${workspace} open`);
    return url.href;
  }
  if (url.protocol === 'file:') {
    const path = decodeURIComponent(url.pathname);
    const base = workspace.replace(/\/$/, '');
    if (path.split('/').includes('..') || (path !== base && !path.startsWith(`${base}/`))) {
      throw new ToolInputError('browser_navigate', `file:// URLs must be under the workspace (${base})`);
    }
    return url.href;
  }
  throw new ToolInputError('browser_navigate', `unsupported URL scheme ${url.protocol} (use http://localhost:… or file://${workspace}/…)`);
}

function browserOf(ctx: ToolContext, tool: string) {
  if (!ctx.browser) throw new ToolInputError(tool, "this Session's Environment has no browser (set `browser: true` on the Environment)");
  return ctx.browser;
}

/** The page as the model reads it: URL, title, and the bounded accessibility tree with refs. */
export async function pageSnapshot(page: Page): Promise<{ text: string; truncated: boolean }> {
  const tree = await page.ariaSnapshot({ mode: 'ai', timeout: ACTION_TIMEOUT_MS });
  const capped = capText(tree, SNAPSHOT_MAX_CHARS);
  const title = await page.title().catch(() => '');
  return { text: `- Page URL: ${page.url()}\n- Page Title: ${title}\n- Page Snapshot:\n\`\`\`yaml\n${capped.text}\n\`\`\``, truncated: capped.truncated };
}

/** Runs a browser action; a crash or a Playwright error becomes an error result for the model. */
async function act(ctx: ToolContext, tool: string, op: (page: Page) => Promise<ToolOutcome>): Promise<ToolOutcome> {
  const started = Date.now();
  const browser = browserOf(ctx, tool);
  try {
    const out = await browser.use(op, ctx.signal);
    return { ...out, meta: { ...out.meta, durationMs: Date.now() - started } };
  } catch (err) {
    if (err instanceof ToolInputError) throw err;
    if (err instanceof BrowserInterrupted) return { content: 'The browser call was interrupted.', is_error: true, meta: { killed: true, durationMs: Date.now() - started } };
    const message = err instanceof BrowserCrashError
      ? `The browser crashed: ${err.message}.`
      : `${tool} failed: ${(err as Error).message.split('\n').filter((l) => l.trim() && !l.includes('Call log')).slice(0, 3).join('\n')}`;
    return { content: message, is_error: true, meta: { durationMs: Date.now() - started } };
  }
}

function refLocator(page: Page, tool: string, ref: string) {
  if (!/^[a-z]*\d*e\d+$/.test(ref)) throw new ToolInputError(tool, `'ref' must be an element reference from browser_snapshot, such as e3`);
  return page.getByRef(ref);
}

const withSnapshot = async (page: Page, line: string): Promise<ToolOutcome> => {
  const snap = await pageSnapshot(page);
  return { content: `${line}\n${snap.text}`, is_error: false, meta: { truncated: snap.truncated } };
};

export const browserNavigateTool: BuiltinTool = {
  spec: {
    name: 'browser_navigate',
    description: 'Open a URL in the sandbox browser: a file under the workspace (file:///workspace/… or an absolute path) or a server started in the sandbox (http://localhost:PORT/…). There is no network. Returns the page snapshot.',
    input_schema: { type: 'object', properties: { url: { type: 'string' } }, required: ['url'], additionalProperties: false },
  },
  async run(ctx, input) {
    const { url } = fields<{ url: string }>('browser_navigate', input, { url: { kind: 'string', required: true } });
    const target = allowedUrl(url, ctx.sandbox.workspace);
    return act(ctx, 'browser_navigate', async (page) => {
      await page.goto(target, { timeout: ACTION_TIMEOUT_MS, waitUntil: 'load' });
      return withSnapshot(page, `Navigated to ${page.url()}`);
    });
  },
};

export const browserSnapshotTool: BuiltinTool = {
  spec: {
    name: 'browser_snapshot',
    description: `The current page's accessibility tree (YAML, at most ${SNAPSHOT_MAX_CHARS} characters), with [ref=eN] element references for browser_click and browser_type.`,
    input_schema: { type: 'object', properties: {}, additionalProperties: false },
  },
  async run(ctx, input) {
    fields('browser_snapshot', input ?? {}, {});
    return act(ctx, 'browser_snapshot', async (page) => {
      const snap = await pageSnapshot(page);
      return { content: snap.text, is_error: false, meta: { truncated: snap.truncated } };
    });
  },
};

export const browserClickTool: BuiltinTool = {
  spec: {
    name: 'browser_click',
    description: 'Click an element by its reference from the latest browser_snapshot. Returns the page snapshot after the click.',
    input_schema: {
      type: 'object',
      properties: { ref: { type: 'string', description: 'Element reference, e.g. e3.' }, element: { type: 'string', description: 'What the element is (for the record).' } },
      required: ['ref'],
      additionalProperties: false,
    },
  },
  async run(ctx, input) {
    const { ref } = fields<{ ref: string; element?: string }>('browser_click', input, { ref: { kind: 'string', required: true }, element: { kind: 'string' } });
    return act(ctx, 'browser_click', async (page) => {
      await refLocator(page, 'browser_click', ref).click({ timeout: ACTION_TIMEOUT_MS });
      return withSnapshot(page, `Clicked ${ref}`);
    });
  },
};

export const browserTypeTool: BuiltinTool = {
  spec: {
    name: 'browser_type',
    description: 'Type text into an editable element by its reference (its content is replaced); submit presses Enter afterwards.',
    input_schema: {
      type: 'object',
      properties: { ref: { type: 'string' }, text: { type: 'string' }, submit: { type: 'boolean' }, element: { type: 'string' } },
      required: ['ref', 'text'],
      additionalProperties: false,
    },
  },
  async run(ctx, input) {
    const { ref, text, submit } = fields<{ ref: string; text: string; submit?: boolean; element?: string }>('browser_type', input, {
      ref: { kind: 'string', required: true }, text: { kind: 'string', required: true }, submit: { kind: 'boolean' }, element: { kind: 'string' },
    });
    return act(ctx, 'browser_type', async (page) => {
      const target = refLocator(page, 'browser_type', ref);
      await target.fill(text, { timeout: ACTION_TIMEOUT_MS });
      if (submit) await target.press('Enter', { timeout: ACTION_TIMEOUT_MS });
      return withSnapshot(page, `Typed into ${ref}${submit ? ' and pressed Enter' : ''}`);
    });
  },
};

export const browserPressKeyTool: BuiltinTool = {
  spec: {
    name: 'browser_press_key',
    description: 'Press a key on the focused element, e.g. Enter, Tab, ArrowDown, a, Control+A.',
    input_schema: { type: 'object', properties: { key: { type: 'string' } }, required: ['key'], additionalProperties: false },
  },
  async run(ctx, input) {
    const { key } = fields<{ key: string }>('browser_press_key', input, { key: { kind: 'string', required: true } });
    if (key.length === 0 || key.length > 64) throw new ToolInputError('browser_press_key', "'key' must be 1 to 64 characters");
    return act(ctx, 'browser_press_key', async (page) => {
      await page.keyboard.press(key);
      return { content: `Pressed ${key}`, is_error: false };
    });
  },
};

export const browserWaitForTool: BuiltinTool = {
  spec: {
    name: 'browser_wait_for',
    description: `Wait until text appears (text), disappears (text_gone), or a time passes (time_ms); at most ${WAIT_MAX_MS} ms.`,
    input_schema: {
      type: 'object',
      properties: { text: { type: 'string' }, text_gone: { type: 'string' }, time_ms: { type: 'number' }, timeout_ms: { type: 'number' } },
      additionalProperties: false,
    },
  },
  async run(ctx, input) {
    const args = fields<{ text?: string; text_gone?: string; time_ms?: number; timeout_ms?: number }>('browser_wait_for', input ?? {}, {
      text: { kind: 'string' }, text_gone: { kind: 'string' }, time_ms: { kind: 'number' }, timeout_ms: { kind: 'number' },
    });
    if (args.text === undefined && args.text_gone === undefined && args.time_ms === undefined) throw new ToolInputError('browser_wait_for', 'give text, text_gone or time_ms');
    const timeout = Math.min(WAIT_MAX_MS, Math.max(1, Math.floor(args.timeout_ms ?? ACTION_TIMEOUT_MS)), ctx.maxTimeoutMs ?? WAIT_MAX_MS);
    return act(ctx, 'browser_wait_for', async (page) => {
      if (args.time_ms !== undefined) await page.waitForTimeout(Math.min(WAIT_MAX_MS, Math.max(0, args.time_ms)));
      if (args.text !== undefined) await page.getByText(args.text).first().waitFor({ state: 'visible', timeout });
      if (args.text_gone !== undefined) await page.getByText(args.text_gone).first().waitFor({ state: 'hidden', timeout });
      return withSnapshot(page, 'Waited');
    });
  },
};

export const browserScreenshotTool: BuiltinTool = {
  spec: {
    name: 'browser_screenshot',
    description: `A PNG of the visible page (${VIEWPORT.width}×${VIEWPORT.height}), stored as a File of the Session and shown to you as an image.`,
    input_schema: { type: 'object', properties: {}, additionalProperties: false },
  },
  async run(ctx, input) {
    fields('browser_screenshot', input ?? {}, {});
    return act(ctx, 'browser_screenshot', async (page) => {
      const png = await page.screenshot({ type: 'png', timeout: ACTION_TIMEOUT_MS });
      const size = pngSize(png);
      if (!ctx.storeFile) return { content: 'The screenshot could not be stored: this Run has no File store.', is_error: true };
      const { file_id } = await ctx.storeFile({ filename: `screenshot-${Date.now()}.png`, content_type: 'image/png', data: png, tool_use_id: ctx.toolUseId ?? '' });
      const line = `Screenshot of ${page.url()} (${size?.width ?? '?'}×${size?.height ?? '?'} PNG, ${png.length} bytes) stored as File ${file_id}.`;
      if (png.length > SCREENSHOT_MAX_BYTES) return { content: `${line} It is too large to show here; read the page with browser_snapshot.`, is_error: false, meta: { fileId: file_id } };
      return { content: line, is_error: false, images: [{ type: 'image', media_type: 'image/png', data: png.toString('base64') }], meta: { fileId: file_id } };
    });
  },
};

export const BROWSER_TOOLS: readonly BuiltinTool[] = [
  browserNavigateTool, browserSnapshotTool, browserClickTool, browserTypeTool, browserPressKeyTool, browserWaitForTool, browserScreenshotTool,
];

export const BROWSER_TOOL_NAMES: readonly string[] = BROWSER_TOOLS.map((t) => t.spec.name);
