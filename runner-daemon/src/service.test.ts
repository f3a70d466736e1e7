import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir, userInfo } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { installService, renderUnit, serviceStatus, userExists, validUserName, type UnitOptions } from './service.js';

const dirs: string[] = [];
const tmp = (): string => {
  const d = mkdtempSync(join(tmpdir(), 'runner-service-'));
  dirs.push(d);
  return d;
};
afterAll(() => {
  for (const d of dirs) rmSync(d, { recursive: true, force: true });
});

const unit = (o: Partial<UnitOptions> = {}): UnitOptions => ({
  name: 'agentplane-runner-test', configDir: '/srv/runner', user: userInfo().username, drainDeadlineMs: 60_000, startArgs: [],
  nodePath: '/usr/bin/node', cliPath: '/opt/agentplane/cli.js', environment: {}, ...o,
});

describe('service --user', () => {
  it('takes user names and uids, nothing that could break the unit file', () => {
    for (const ok of ['agentplane', 'svc-runner', 'john.doe', '_runner', '1001', 'machine$']) expect(validUserName(ok), ok).toBe(true);
    for (const bad of ['', 'a b', 'root\nExecStartPre=/bin/sh', '-u', 'x/y', '"q"']) expect(validUserName(bad), JSON.stringify(bad)).toBe(false);
  });

  it('knows which accounts exist on this machine', () => {
    expect(userExists(userInfo().username)).toBe(true);
    expect(userExists('agentplane-no-such-user-7f3a')).toBe(false);
    expect(userExists('bad name')).toBe(false);
    expect(renderUnit(unit({ user: 'agentplane' }))).toMatch(/^User=agentplane$/m);
  });
});

describe('the unit', () => {
  it('restarts the daemon on failure, but not after exit code 5 (its credential refused for good)', () => {
    const text = renderUnit(unit());
    expect(text).toMatch(/^Restart=on-failure$/m);
    expect(text).toMatch(/^RestartPreventExitStatus=5$/m);
  });
});

describe('service status without systemctl', () => {
  it('says the unit is installed, and that whether it is active is unknown', () => {
    const ctx = { unitDir: tmp(), systemctl: false };
    const missing = serviceStatus(ctx, 'agentplane-runner-test');
    expect(missing).toMatchObject({ ok: false, active: false });
    expect(installService(ctx, unit(), false).ok).toBe(true);
    const installed = serviceStatus(ctx, 'agentplane-runner-test');
    expect(installed).toMatchObject({ ok: true, active: null });
    expect(installed.message).toContain('--no-systemctl');
  });
});
