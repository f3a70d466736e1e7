import { spawn } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { ROOT_DIR } from './harness/platform.js';

/**
 * `npm run build:sandbox-image -- --help` prints its options and builds nothing; an option it does
 * not know is refused (exit 2) instead of starting a build (both used to build the image).
 */
const run = (args: string[], script = 'docker/sandbox/build.ts', env: Record<string, string> = {}): Promise<{ code: number | null; out: string; err: string }> =>
  new Promise((resolve) => {
    // No DOCKER_HOST and no Docker socket reachable from this environment would make a build fail
    // slowly; what is asserted is that none starts.
    const child = spawn(join(ROOT_DIR, 'node_modules/.bin/tsx'), [script, ...args], {
      cwd: ROOT_DIR, env: { PATH: process.env.PATH ?? '/usr/bin:/bin', HOME: process.env.HOME ?? '/tmp', DOCKER_HOST: 'unix:///nonexistent/docker.sock', ...env }, stdio: ['ignore', 'pipe', 'pipe'],
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

describe('the other setup scripts refuse what they do not know before changing anything', () => {
  it('build:image: an unknown option is exit 2, one line', async () => {
    const r = await run(['--tga', 'x:1'], 'docker/image/build.ts');
    expect([r.code, r.err]).toEqual([2, "build:image: unknown argument '--tga' (options: --tag <name:tag>, --force, --help)\n"]);
  }, 60_000);

  it('the cluster load balancer: --help, and a bad setting as one line with exit 2', async () => {
    const [help, port, upstream] = await Promise.all([
      run(['--help'], 'docker/cluster/lb.mjs'),
      run([], 'docker/cluster/lb.mjs', { LB_PORT: 'abc', LB_UPSTREAMS: 'api-1:8080' }),
      run([], 'docker/cluster/lb.mjs', { LB_PORT: '8080', LB_UPSTREAMS: '127.0.0.1:abc' }),
    ]);
    expect([help.code, help.err]).toEqual([0, '']);
    expect(help.out).toContain('LB_UPSTREAMS');
    expect([port.code, port.err]).toEqual([2, "lb: LB_PORT must be a port from 1 to 65535, got 'abc'\n"]);
    expect([upstream.code, upstream.err]).toEqual([2, "lb: LB_UPSTREAMS: the port of '127.0.0.1:abc' must be a port from 1 to 65535, got 'abc'\n"]);
  }, 60_000);

  it('gvisor-runtime: an unknown option is exit 2 and Docker\'s configuration is not written; a configuration that is not JSON is left as it is', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'gvisor-runtime-'));
    try {
      const file = join(dir, 'daemon.json');
      writeFileSync(file, '{"log-level": "warn"}');
      const dry = await run(['--dry-run'], 'docker/gvisor-runtime.mjs', { DOCKER_DAEMON_JSON: file });
      expect([dry.code, dry.err]).toEqual([2, "unknown argument '--dry-run': this script takes only --help (see --help)\n"]);
      expect(readFileSync(file, 'utf8')).toBe('{"log-level": "warn"}');
      writeFileSync(file, '{bad');
      // A runsc of its own on PATH: the check runs whether or not the machine has gVisor.
      writeFileSync(join(dir, 'runsc'), '#!/bin/sh\n', { mode: 0o755 });
      const broken = await run([], 'docker/gvisor-runtime.mjs', { DOCKER_DAEMON_JSON: file, PATH: `${dir}:${process.env.PATH ?? '/usr/bin:/bin'}` });
      expect(broken.code).toBe(1);
      expect(broken.err).toMatch(/^\S+daemon\.json is not JSON \(.*\): fix it first; nothing was changed\n$/);
      expect(readFileSync(file, 'utf8')).toBe('{bad');
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  }, 60_000);
});
