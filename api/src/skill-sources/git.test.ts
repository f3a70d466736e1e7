import { execFileSync } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { remoteHead } from './git.js';

const dirs: string[] = [];
afterAll(() => {
  for (const d of dirs) rmSync(d, { recursive: true, force: true });
});

/** A repository with a commit on `main`, and another commit whose ref ends the same way. */
function repository(): { dir: string; main: string; decoy: string } {
  const dir = mkdtempSync(join(tmpdir(), 'remote-head-'));
  dirs.push(dir);
  const git = (...args: string[]) => execFileSync('git', ['-c', 'user.name=t', '-c', 'user.email=t@example.invalid', ...args], { cwd: dir, encoding: 'utf8' }).trim();
  git('init', '-q', '-b', 'main');
  writeFileSync(join(dir, 'a.txt'), 'one');
  git('add', 'a.txt');
  git('commit', '-q', '-m', 'one');
  const main = git('rev-parse', 'HEAD');
  writeFileSync(join(dir, 'a.txt'), 'two');
  git('commit', '-q', '-am', 'two');
  const decoy = git('rev-parse', 'HEAD');
  git('update-ref', 'refs/heads/a/refs/heads/main', decoy);
  git('reset', '-q', '--hard', main);
  return { dir, main, decoy };
}

describe('remoteHead', () => {
  it("reads the branch's own ref, not another whose name ends the same way (sorted before it)", async () => {
    const { dir, main, decoy } = repository();
    expect(main).not.toBe(decoy);
    expect(await remoteHead({ url: dir, env: {} }, 'main')).toBe(main);
    expect(await remoteHead({ url: dir, env: {} }, 'heads/main')).toBeNull();
    expect(await remoteHead({ url: dir, env: {} }, 'absent')).toBeNull();
  });
});
