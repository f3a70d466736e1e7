import { spawn } from 'node:child_process';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { ROOT_DIR } from './harness/platform.js';

/**
 * `npm run build:sandbox-image -- --help` prints its options and builds nothing; an option it does
 * not know is refused (exit 2) instead of starting a build (both used to build the image).
 */
const run = (args: string[]): Promise<{ code: number | null; out: string; err: string }> =>
  new Promise((resolve) => {
    // No DOCKER_HOST and no Docker socket reachable from this environment would make a build fail
    // slowly; what is asserted is that none starts.
    const child = spawn(join(ROOT_DIR, 'node_modules/.bin/tsx'), ['docker/sandbox/build.ts', ...args], {
      cwd: ROOT_DIR, env: { PATH: process.env.PATH ?? '/usr/bin:/bin', HOME: process.env.HOME ?? '/tmp', DOCKER_HOST: 'unix:///nonexistent/docker.sock' }, stdio: ['ignore', 'pipe', 'pipe'],
    });
    let out = '';
    let err = '';
    child.stdout.on('data', (d: Buffer) => (out += d.toString('utf8')));
    child.stderr.on('data', (d: Buffer) => (err += d.toString('utf8')));
    child.once('exit', (code) => resolve({ code, out, err }));
  });

describe('build:sandbox-image command line', () => {
  it('--help prints the options and exits 0; an unknown option is exit 2 with the usage', async () => {
    const [help, bogus] = await Promise.all([run(['--help']), run(['--bogus'])]);
    expect(help.code).toBe(0);
    expect(help.out).toContain('Usage: npm run build:sandbox-image');
    expect(help.out).toContain('--browser');
    expect(help.err).toBe('');
    expect(bogus.code).toBe(2);
    expect(bogus.err.split('\n')[0]).toMatch(/^build:sandbox-image: Unknown option '--bogus'/);
    expect(bogus.err).toContain('Usage: npm run build:sandbox-image');
  }, 60_000);
});
