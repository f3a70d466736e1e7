import { chmodSync, existsSync, mkdirSync, mkdtempSync, readdirSync, rmSync, statSync, symlinkSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { ConfigError } from '@agentplane/core';
import { checkWritableConfigDir, credentialPath, loadCredential, saveCredential, saveState, statePath, type RunnerStateFile } from './runner-files.js';

const dirs: string[] = [];
const tmp = (): string => {
  const d = mkdtempSync(join(tmpdir(), 'runner-config-'));
  dirs.push(d);
  return d;
};
afterAll(() => {
  for (const d of dirs) rmSync(d, { recursive: true, force: true });
});

const STATE: RunnerStateFile = {
  pid: process.pid, status: 'ready', connected: true, generation: 1, base_url: 'http://127.0.0.1:1', runner_id: 'runner_c',
  last_heartbeat_ack_at: null, reconnect_attempt: 0, drain: null, updated_at: new Date().toISOString(),
};
const CRED = {
  base_url: 'http://127.0.0.1:1', secret: 's', runner_id: 'runner_c', runner_credential_id: 'rcred_c', runner_pool_id: 'rpool_c',
  workspace_id: 'wksp_c', machine_label: 'box', paired_at: '2026-01-01T00:00:00.000Z',
};

describe('runner config files', () => {
  it('a state write on a full disk throws ENOSPC and leaves no temp file behind', () => {
    const dir = tmp();
    // The temp file the write goes through is /dev/full: every write to it fails with ENOSPC.
    const tmpFile = `${statePath(dir)}.${process.pid}.tmp`;
    symlinkSync('/dev/full', tmpFile);
    expect(() => saveState(dir, STATE)).toThrow(expect.objectContaining({ code: 'ENOSPC' }));
    expect(readdirSync(dir)).toEqual([]);
    // And once there is room again, the write works.
    saveState(dir, STATE);
    expect(readdirSync(dir)).toEqual(['state.json']);
  });

  it('a state write whose rename fails leaves the old file and no temp file', () => {
    const dir = tmp();
    mkdirSync(statePath(dir));
    writeFileSync(join(statePath(dir), 'keep'), 'x');
    expect(() => saveState(dir, STATE)).toThrow(expect.objectContaining({ code: expect.stringMatching(/^E(ISDIR|NOTEMPTY|EXIST)$/) }));
    expect(readdirSync(dir)).toEqual(['state.json']);
  });

  it('the config dir holding the credential is made 0700, an existing 0755 one included', () => {
    const dir = tmp();
    chmodSync(dir, 0o755);
    saveCredential(dir, CRED);
    expect(statSync(dir).mode & 0o777).toBe(0o700);
    expect(statSync(credentialPath(dir)).mode & 0o777).toBe(0o600);
    const fresh = join(tmp(), 'a', 'b');
    checkWritableConfigDir(fresh);
    expect(statSync(fresh).mode & 0o777).toBe(0o700);
    expect(readdirSync(fresh)).toEqual([]);
  });

  it('the write probe fails with the filesystem error when the dir cannot be made (a path under a file)', () => {
    const file = join(tmp(), 'file');
    writeFileSync(file, 'x');
    expect(() => checkWritableConfigDir(join(file, 'cfg'))).toThrow(expect.objectContaining({ code: 'ENOTDIR' }));
  });

  it('a damaged runner.json is a configuration error naming the file', () => {
    const dir = tmp();
    writeFileSync(credentialPath(dir), '{"base_url": "http://x", "secret": ');
    expect(() => loadCredential(dir)).toThrow(ConfigError);
    expect(() => loadCredential(dir)).toThrow(`the runner credential file ${credentialPath(dir)} is not valid JSON`);
    writeFileSync(credentialPath(dir), '{"base_url": "http://x"}');
    expect(() => loadCredential(dir)).toThrow(new RegExp(`${credentialPath(dir)} is damaged \\(missing secret, runner_id`));
    writeFileSync(credentialPath(dir), '[]');
    expect(() => loadCredential(dir)).toThrow(ConfigError);
    expect(existsSync(credentialPath(tmp()))).toBe(false);
    expect(loadCredential(tmp())).toBeNull();
  });
});
