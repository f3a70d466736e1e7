import { existsSync } from 'node:fs';
import Docker from 'dockerode';
import { describe, expect, it } from 'vitest';
import { browserFiles, BROWSER_BINARY, BROWSER_NODE_PATH, ensureBrowserImage } from './browser-image.js';

const hasChromium = existsSync(BROWSER_BINARY);

describe.skipIf(!hasChromium)('browser image', () => {
  it('carries Chromium, the libraries it loads, fonts and playwright-core; a present image is not rebuilt', async () => {
    const files = await browserFiles();
    const paths = new Set(files.map((f) => f.path));
    expect(paths.has(BROWSER_BINARY)).toBe(true);
    expect([...paths].some((p) => /\/libnss3\.so$/.test(p))).toBe(true);
    expect([...paths].some((p) => p.startsWith('/usr/share/fonts/truetype/dejavu/'))).toBe(true);
    expect(paths.has(`${BROWSER_NODE_PATH}/playwright-core/package.json`)).toBe(true);
    expect([...paths].some((p) => p.startsWith('/usr/share/doc/'))).toBe(false);

    const docker = new Docker();
    const first = await ensureBrowserImage({ docker });
    const again = await ensureBrowserImage({ docker });
    expect(again.built).toBe(false);
    expect(again.tag).toBe(first.tag);
    expect((await docker.getImage(again.latest).inspect()).Id).toBe((await docker.getImage(again.tag).inspect()).Id);
  }, 120_000);
});
