import { randomBytes } from 'node:crypto';
import { existsSync } from 'node:fs';
import Docker from 'dockerode';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { BrowserSession } from '../harness/tools/browser-session.js';
import { BROWSER_BINARY, ensureBrowserImage } from './browser-image.js';
import { FrameSplitter, launchInSandbox, MAX_BROWSER_FRAME_BYTES } from './browser.js';
import { DockerDriver } from './docker-driver.js';
import { ensureSandboxImage } from './image.js';

describe('the browser bridge splits the DevTools pipe', () => {
  it('into NUL-terminated messages across chunks, scanning each chunk once', () => {
    const frames: string[] = [];
    let overflows = 0;
    const s = new FrameSplitter((f) => frames.push(f.toString('utf8')), () => overflows++, 8);
    s.push(Buffer.from('{"a"'));
    s.push(Buffer.from(':1}\0{}\0'));
    s.push(Buffer.from('\0x'));
    s.push(Buffer.from('y\0'));
    expect(frames).toEqual(['{"a":1}', '{}', '', 'xy']);
    expect(overflows).toBe(0);
  });

  it('holds at most its bound of an unfinished message, then reports once and drops the rest', () => {
    const frames: string[] = [];
    let overflows = 0;
    const s = new FrameSplitter((f) => frames.push(f.toString('utf8')), () => overflows++, 8);
    s.push(Buffer.from('12345678\0'));
    s.push(Buffer.from('12345'));
    s.push(Buffer.from('6789'));
    s.push(Buffer.from('\0ok\0'));
    expect(frames).toEqual(['12345678']);
    expect(overflows).toBe(1);
  });
});

/**
 * Any process of the sandbox can write into the pipe the runner reads Chromium's messages from
 * (the exec's stdout, open as fd 1 of its wrapper shell). A message without end must close the
 * browser, not grow the runner.
 */
const hasChromium = existsSync(BROWSER_BINARY);
const runnerId = `rtest-${randomBytes(4).toString('hex')}`;
const docker = new Docker();
const driver = new DockerDriver({ runnerId, docker, browserImage: 'agentplane/sandbox-browser:latest' });

describe.skipIf(!hasChromium)('the browser bridge with a sandbox writing into its pipe', () => {
  beforeAll(async () => {
    await ensureSandboxImage({ docker });
    await ensureBrowserImage({ docker });
  }, 300_000);
  afterAll(async () => {
    await driver.reapOrphans(runnerId, []);
  });

  it(`closes the browser past ${MAX_BROWSER_FRAME_BYTES} bytes without a NUL, reports why, and keeps the runner's memory bounded`, async () => {
    const session = { id: `sess_${randomBytes(8).toString('hex')}` };
    const sb = await driver.ensure(session, { browser: true });
    const browser = new BrowserSession(() => launchInSandbox(driver, sb, { timeoutMs: 30_000 }));
    try {
      await browser.use((page) => page.goto('data:text/html,<title>x</title>'));
      const before = process.memoryUsage();
      let peak = before.rss;
      const sample = setInterval(() => (peak = Math.max(peak, process.memoryUsage().rss)), 25);
      // 80 MiB with no NUL, from a command of the sandbox, into the wrapper shell's fd 1 (Chromium stopped, so it writes nothing between).
      const mib = MAX_BROWSER_FRAME_BYTES / 1048576 + 16;
      const script = [
        `pid=$(ps -eo pid,args | awk '/agentplane-exec/ && /remote-debugging-pipe/ && $2=="bash" {print $1}' | head -1)`,
        `for c in $(ps -eo pid,args | awk '$2 ~ /chromium/ {print $1}'); do kill -STOP $c; done`,
        `head -c ${mib}M /dev/zero | tr '\\0' a > /proc/$pid/fd/1`,
      ].join('\n');
      const attack = driver.exec(sb, { script }, { timeoutMs: 60_000 }).catch(() => undefined);
      try {
        // Waits for the browser's end: without the bound it never comes (the test times out).
        await expect(browser.use(() => new Promise<never>(() => undefined))).rejects.toThrow(
          `the browser's DevTools pipe carried a message longer than ${MAX_BROWSER_FRAME_BYTES} bytes`,
        );
      } finally {
        clearInterval(sample);
      }
      await attack;
      // One bounded message held, plus stream buffers not yet collected: generous, but bounded
      // whatever the sandbox writes (an unbounded bridge grew by gigabytes here).
      expect(peak - before.rss).toBeLessThan(256 * 1024 * 1024);
      // The next call starts a new browser in the same sandbox.
      expect(await browser.use((page) => page.evaluate(() => 1 + 1))).toBe(2);
    } finally {
      await browser.close();
      await driver.destroy(session.id);
    }
  }, 60_000);
});
