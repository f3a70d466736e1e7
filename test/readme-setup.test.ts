import { chmodSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { spawnSync } from 'node:child_process';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { ROOT_DIR } from './harness/platform.js';

/**
 * The README's set-up line on a fresh Debian machine, as root (no `sudo` installed) and as a
 * sudoer: apt-get (and sudo) are stand-ins that record how they were called.
 */
const dirs: string[] = [];
afterAll(() => {
  for (const d of dirs) rmSync(d, { recursive: true, force: true });
});

function setupLine(): string {
  const readme = readFileSync(join(ROOT_DIR, 'README.md'), 'utf8');
  const section = readme.slice(readme.indexOf('## Set-up on a fresh Debian machine'));
  const block = /```sh\n([^`]+)```/.exec(section)?.[1]?.trim();
  if (!block) throw new Error('no set-up block in the README');
  return block;
}

function run(line: string, withSudo: boolean): { status: number | null; calls: string[] } {
  const bin = mkdtempSync(join(tmpdir(), 'agentplane-setup-'));
  dirs.push(bin);
  const log = join(bin, 'calls.log');
  const stub = (name: string, body: string) => {
    writeFileSync(join(bin, name), `#!/bin/sh\n${body}\n`);
    chmodSync(join(bin, name), 0o755);
  };
  stub('apt-get', `echo "apt-get $*" >> "${log}"`);
  if (withSudo) stub('sudo', `echo "sudo $1" >> "${log}"; exec "$@"`);
  writeFileSync(log, '');
  const r = spawnSync('/bin/sh', ['-c', line], { env: { PATH: bin }, encoding: 'utf8' });
  return { status: r.status, calls: readFileSync(log, 'utf8').split('\n').filter(Boolean) };
}

describe('README set-up line', () => {
  it('works as root without sudo installed: apt-get update, then install', () => {
    const { status, calls } = run(setupLine(), false);
    expect(status).toBe(0);
    expect(calls[0]).toBe('apt-get update');
    expect(calls[1]).toMatch(/^apt-get install -y redis-server /);
  });

  it('works as a sudoer: both apt-get calls go through sudo', () => {
    const { status, calls } = run(setupLine(), true);
    expect(status).toBe(0);
    expect(calls).toEqual(['sudo apt-get', 'apt-get update', 'sudo apt-get', expect.stringMatching(/^apt-get install -y redis-server /)]);
  });
});
