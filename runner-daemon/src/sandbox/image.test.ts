import { execFileSync } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import Docker from 'dockerode';
import { describe, expect, it } from 'vitest';
import { assembleRootfs, ensureSandboxImage, loadManifest } from './image.js';
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
    expect(again.built).toBe(false);
    expect(lines.at(-1)).toContain('is up to date');
    const info = await docker.getImage(again.latest).inspect();
    expect(info.RepoTags).toContain(again.tag);
    expect(info.Config.User).toBe('10001:10001');
  });
});
