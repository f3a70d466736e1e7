import { randomBytes } from 'node:crypto';
import { existsSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import Docker from 'dockerode';
import { describe, expect, it } from 'vitest';
import { browserFiles, BROWSER_BINARY, BROWSER_NODE_PATH, ensureBrowserImage } from './browser-image.js';
import { ensureSandboxImage } from './image.js';

const hasChromium = existsSync(BROWSER_BINARY);

describe.skipIf(!hasChromium)('browser image', () => {
  it('carries Chromium, the libraries it loads, fonts and playwright-core; a present image is not rebuilt nor the default rootfs read', async () => {
    const files = await browserFiles();
    const paths = new Set(files.map((f) => f.path));
    expect(paths.has(BROWSER_BINARY)).toBe(true);
    expect([...paths].some((p) => /\/libnss3\.so$/.test(p))).toBe(true);
    expect([...paths].some((p) => p.startsWith('/usr/share/fonts/truetype/dejavu/'))).toBe(true);
    expect(paths.has(`${BROWSER_NODE_PATH}/playwright-core/package.json`)).toBe(true);
    expect([...paths].some((p) => p.startsWith('/usr/share/doc/'))).toBe(false);

    const docker = new Docker();
    // The default image, labelled with its inputs, stands in for reading the default rootfs.
    await ensureSandboxImage({ docker });
    const first = await ensureBrowserImage({ docker });
    const lines: string[] = [];
    const again = await ensureBrowserImage({ docker, onProgress: (l) => lines.push(l) });
    expect(again).toMatchObject({ built: false, cached: true });
    expect(lines.at(-1)).toContain('is up to date by its inputs');
    expect(again.tag).toBe(first.tag);
    expect((await docker.getImage(again.latest).inspect()).Id).toBe((await docker.getImage(again.tag).inspect()).Id);
  }, 120_000);

  it('builds from a default image found by its inputs with the tag a present image is found by', async () => {
    const docker = new Docker();
    const dir = mkdtempSync(join(tmpdir(), 'agentplane-browser-image-'));
    const repository = `agentplane-test/browser-${randomBytes(4).toString('hex')}`;
    const manifestPath = join(dir, 'manifest.json');
    writeFileSync(manifestPath, JSON.stringify({
      repository, user: { name: 'agent', uid: 10001, gid: 10001, home: '/home/agent' }, workspace: '/workspace',
      commands: ['bash', 'cat', 'sleep', 'setsid'], links: {}, env: { PATH: '/usr/bin' },
    }));
    const ids = new Set<string>();
    try {
      const base = await ensureSandboxImage({ docker, manifestPath });
      ids.add((await docker.getImage(base.tag).inspect()).Id);
      const first = await ensureBrowserImage({ docker, manifestPath });
      ids.add((await docker.getImage(first.tag).inspect()).Id);
      expect(first).toMatchObject({ built: true, cached: false });
      expect(first.tag.startsWith(`${repository}-browser:`)).toBe(true);
      const again = await ensureBrowserImage({ docker, manifestPath });
      expect(again).toMatchObject({ built: false, cached: true, tag: first.tag });
    } finally {
      for (const id of ids) await docker.getImage(id).remove({ force: true }).catch(() => undefined);
      rmSync(dir, { recursive: true, force: true });
    }
  }, 120_000);
});
