import { execFileSync } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { copyFileSync, mkdirSync, mkdtempSync, readFileSync, realpathSync, rmSync, statSync, utimesSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { basename, join } from 'node:path';
import Docker from 'dockerode';
import { describe, expect, it } from 'vitest';
import { assembleRootfs, ensureSandboxImage, IMAGE_LABELS, loadManifest, type SandboxImageManifest } from './image.js';
import { createTar } from './tar.js';

describe('sandbox image', () => {
  it('assembles a deterministic rootfs with a non-root user', async () => {
    const manifest = loadManifest();
    const a = await assembleRootfs(manifest);
    const b = await assembleRootfs(manifest);
    expect(a.contentHash).toBe(b.contentHash);
    const passwd = a.entries.find((e) => e.path === '/etc/passwd');
    expect(passwd?.type === 'file' && passwd.data.toString()).toContain('agent:x:10001:10001');
    const workspace = a.entries.find((e) => e.path === '/workspace');
    expect(workspace).toMatchObject({ type: 'dir', uid: 10001 });
    expect(a.entries.some((e) => e.path === '/usr/bin/bash')).toBe(true);
  });

  it('writes tar archives that tar reads back, long names and modes included', () => {
    const dir = mkdtempSync(join(tmpdir(), 'agentplane-tar-'));
    try {
      const long = `${'deep/'.repeat(30)}file.txt`;
      writeFileSync(join(dir, 'x.tar'), createTar([
        { type: 'dir', path: 'a' },
        { type: 'file', path: 'a/run.sh', data: Buffer.from('#!/bin/sh\n'), mode: 0o755 },
        { type: 'file', path: long, data: Buffer.from('long') },
        { type: 'symlink', path: 'a/link', target: 'run.sh' },
      ]));
      execFileSync('tar', ['-xf', 'x.tar', '--no-same-owner'], { cwd: dir });
      expect(statSync(join(dir, 'a/run.sh')).mode & 0o777).toBe(0o755);
      expect(readFileSync(join(dir, long), 'utf8')).toBe('long');
      expect(readFileSync(join(dir, 'a/link'), 'utf8')).toBe('#!/bin/sh\n');
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });

  it('skips the build when the image for the current content exists', async () => {
    const docker = new Docker();
    await ensureSandboxImage({ docker });
    const lines: string[] = [];
    const again = await ensureSandboxImage({ docker, onProgress: (l) => lines.push(l) });
    expect(again).toMatchObject({ built: false, cached: true });
    expect(lines.at(-1)).toContain('is up to date by its inputs');
    expect(lines.some((l) => l.includes('rootfs'))).toBe(false);
    const info = await docker.getImage(again.latest).inspect();
    expect(info.RepoTags).toContain(again.tag);
    expect(info.Config.User).toBe('10001:10001');
    expect(info.Config.Labels?.[IMAGE_LABELS.content]).toBe(again.contentHash);
  });
});

/** Changes one byte in the middle of a file, keeping its size and mtime (only its ctime tells). */
function flipByteKeepingMtime(path: string): void {
  const before = statSync(path, { bigint: true });
  const data = readFileSync(path);
  const at = Math.floor(data.length / 2);
  data[at] = (data[at] ?? 0) ^ 0xff;
  writeFileSync(path, data);
  const seconds = Number(before.mtimeNs / 1_000_000_000n);
  utimesSync(path, seconds, seconds);
  const after = statSync(path, { bigint: true });
  expect([after.size, after.mtimeNs, after.ino]).toEqual([before.size, before.mtimeNs, before.ino]);
}

/** A whole-second mtime, which `utimesSync` can give back exactly. */
const OLD_MTIME = new Date('2020-01-01T00:00:00Z');

describe('sandbox image inputs', () => {
  /**
   * A manifest of the test's own repository whose extra command `probe` is a copy of `ls` in a
   * directory of the test: the images it makes are removed at the end.
   */
  const fixture = (): {
    docker: Docker; dir: string; probe: string; manifest: SandboxImageManifest; cleanup: () => Promise<void>;
    ensure: (manifest?: SandboxImageManifest, force?: boolean) => Promise<Awaited<ReturnType<typeof ensureSandboxImage>> & { lines: string[] }>;
  } => {
    const docker = new Docker();
    const dir = mkdtempSync(join(tmpdir(), 'agentplane-image-'));
    const bin = join(dir, 'bin');
    mkdirSync(bin);
    const probe = join(bin, 'probe');
    copyFileSync('/usr/bin/ls', probe);
    utimesSync(probe, OLD_MTIME, OLD_MTIME);
    const manifest: SandboxImageManifest = {
      repository: `agentplane-test/image-${randomBytes(4).toString('hex')}`,
      user: { name: 'agent', uid: 10001, gid: 10001, home: '/home/agent' },
      workspace: '/workspace',
      commands: ['bash', 'cat', 'sleep', 'setsid', 'probe'],
      links: {},
      env: { PATH: '/usr/bin' },
    };
    const ids = new Set<string>();
    const ensure = async (m = manifest, force = false): Promise<Awaited<ReturnType<typeof ensureSandboxImage>> & { lines: string[] }> => {
      const manifestPath = join(dir, 'manifest.json');
      writeFileSync(manifestPath, JSON.stringify(m));
      const lines: string[] = [];
      const image = await ensureSandboxImage({ docker, manifestPath, force, searchDirs: [bin, '/usr/bin', '/bin'], onProgress: (l) => lines.push(l) });
      ids.add((await docker.getImage(image.tag).inspect()).Id);
      return { ...image, lines };
    };
    const cleanup = async (): Promise<void> => {
      for (const id of ids) await docker.getImage(id).remove({ force: true }).catch(() => undefined);
      rmSync(dir, { recursive: true, force: true });
    };
    return { docker, dir, probe, manifest, ensure, cleanup };
  };

  it('finds an image by its inputs, and rebuilds when the manifest or a binary changes', async () => {
    const { docker, probe, manifest, ensure, cleanup } = fixture();
    try {
      const first = await ensure();
      expect(first).toMatchObject({ built: true, cached: false });
      const again = await ensure();
      expect(again).toMatchObject({ built: false, cached: true, tag: first.tag });
      expect(again.lines.at(-1)).toContain('is up to date by its inputs');

      // Another environment: another image.
      const env = await ensure({ ...manifest, env: { PATH: '/usr/bin', LANG: 'C.UTF-8' } });
      expect(env).toMatchObject({ built: true, cached: false });
      expect(env.tag).not.toBe(first.tag);
      expect(await ensure()).toMatchObject({ built: false, cached: true, tag: first.tag });

      // The binary touched, its content the same: read again, same tag, imported again to record the inputs.
      const before = (await docker.getImage(first.tag).inspect()).Id;
      const later = new Date(OLD_MTIME.getTime() + 86_400_000);
      utimesSync(probe, later, later);
      const touched = await ensure();
      expect(touched).toMatchObject({ built: true, cached: false, tag: first.tag });
      expect(touched.lines.some((l) => l.includes('records other inputs'))).toBe(true);
      // The image it replaced, left without a tag, is gone.
      await expect(docker.getImage(before).inspect()).rejects.toMatchObject({ statusCode: 404 });
      expect(await ensure()).toMatchObject({ built: false, cached: true, tag: first.tag });

      // Its content changed with size and mtime kept: a new image.
      flipByteKeepingMtime(probe);
      const changed = await ensure();
      expect(changed).toMatchObject({ built: true, cached: false });
      expect(changed.tag).not.toBe(first.tag);
      expect(await ensure()).toMatchObject({ built: false, cached: true, tag: changed.tag });

      // force reads and imports even with the inputs unchanged.
      expect(await ensure(manifest, true)).toMatchObject({ built: true, cached: false, tag: changed.tag });
    } finally {
      await cleanup();
    }
  });

  it('rebuilds when a library of the resolved set changes or another one is resolved', async () => {
    const { dir, ensure, cleanup } = fixture();
    const saved = process.env.LD_LIBRARY_PATH;
    try {
      const first = await ensure();
      // A library of `ls` (not the C library, which every process of the test would load) copied
      // into a directory the loader searches first.
      const ldd = execFileSync('ldd', ['/usr/bin/ls'], { encoding: 'utf8' });
      const line = ldd.split('\n').find((l) => l.includes(' => /') && !/libc\.so|ld-linux/.test(l));
      const host = /^\s*(\S+) => (\/\S+)/.exec(line ?? '');
      expect(host?.[2]).toBeTruthy();
      const libDir = join(dir, 'lib');
      mkdirSync(libDir);
      const lib = join(libDir, basename(host?.[1] ?? ''));
      copyFileSync(realpathSync(host?.[2] ?? ''), lib);
      utimesSync(lib, OLD_MTIME, OLD_MTIME);
      process.env.LD_LIBRARY_PATH = libDir;

      const resolved = await ensure();
      expect(resolved).toMatchObject({ built: true, cached: false });
      expect(resolved.tag).not.toBe(first.tag);
      expect(await ensure()).toMatchObject({ built: false, cached: true, tag: resolved.tag });

      // No binary changed: only re-stating the libraries the image names shows this.
      flipByteKeepingMtime(lib);
      const changed = await ensure();
      expect(changed).toMatchObject({ built: true, cached: false });
      expect(changed.tag).not.toBe(resolved.tag);
      expect(await ensure()).toMatchObject({ built: false, cached: true, tag: changed.tag });
    } finally {
      if (saved === undefined) delete process.env.LD_LIBRARY_PATH;
      else process.env.LD_LIBRARY_PATH = saved;
      await cleanup();
    }
  });
});
