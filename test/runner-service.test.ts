import { execFile, spawnSync } from 'node:child_process';
import { existsSync, mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import { tmpdir, userInfo } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { describe, expect, it } from 'vitest';
import { RUNNER_CLI } from './harness/daemon.js';

/**
 * `agentplane-runner service install|uninstall|status` writes a systemd unit that
 * `systemd-analyze verify` accepts. CI installs systemd-analyze (.ci/run sets
 * REQUIRE_SYSTEMD_ANALYZE=1): there a missing one fails instead of skipping.
 */
const run = promisify(execFile);
const analyzePresent = spawnSync('systemd-analyze', ['--version'], { encoding: 'utf8' }).status === 0;
const analyzeRequired = process.env.REQUIRE_SYSTEMD_ANALYZE === '1';

function cli(args: string[], env: Record<string, string> = {}): { status: number | null; out: string } {
  const r = spawnSync(process.execPath, [RUNNER_CLI, ...args], { encoding: 'utf8', env: { PATH: process.env.PATH ?? '/usr/bin:/bin', HOME: process.env.HOME ?? '/tmp', ...env } });
  return { status: r.status, out: `${r.stdout}${r.stderr}` };
}

function pairedDir(): string {
  const dir = mkdtempSync(join(tmpdir(), 'runner-svc-'));
  // install only needs the runner to be paired (the credential file present).
  writeFileSync(join(dir, 'runner.json'), '{}', { mode: 0o600 });
  return dir;
}

describe('agentplane-runner service', () => {
  it('install writes a unit: restart on failure, drain on stop, journal logs; status and uninstall manage it', () => {
    const dir = pairedDir();
    const unitDir = mkdtempSync(join(tmpdir(), 'units-'));
    const common = ['--config-dir', dir, '--unit-dir', unitDir, '--no-systemctl', '--name', 'agentplane-runner-test'];
    const install = cli(['service', 'install', ...common, '--slots', '2', '--drain-deadline-ms', '600000', '--json'], { RUNNER_METRICS_ADDR: '127.0.0.1:9465', SECRET_THING: 'no' });
    expect(install.status, install.out).toBe(0);
    const path = join(unitDir, 'agentplane-runner-test.service');
    const unit = readFileSync(path, 'utf8');
    expect(unit).toMatch(/^Restart=on-failure$/m);
    expect(unit).toMatch(/^KillMode=mixed$/m);
    expect(unit).toMatch(/^KillSignal=SIGTERM$/m);
    expect(unit).toMatch(/^TimeoutStopSec=630$/m);
    expect(unit).toMatch(/^StandardOutput=journal$/m);
    expect(unit).toMatch(/^SyslogIdentifier=agentplane-runner-test$/m);
    expect(unit).toMatch(/^WantedBy=multi-user.target$/m);
    expect(unit).toContain(`User=${userInfo().username}`);
    expect(unit).toContain(`ExecStart=${process.execPath} ${RUNNER_CLI} start --config-dir ${dir} --drain-deadline-ms 600000 --slots 2`);
    expect(unit).toContain('Environment=RUNNER_METRICS_ADDR=127.0.0.1:9465');
    expect(unit).not.toContain('SECRET_THING');

    const status = cli(['service', 'status', ...common, '--json']);
    expect(status.status, status.out).toBe(0);
    expect(JSON.parse(status.out)).toMatchObject({ ok: true, unit: 'agentplane-runner-test.service', path });

    const uninstall = cli(['service', 'uninstall', ...common]);
    expect(uninstall.status, uninstall.out).toBe(0);
    expect(existsSync(path)).toBe(false);
    expect(cli(['service', 'status', ...common]).status).toBe(1);
  });

  it('service --help names every start option install takes, and install writes each into the unit', async () => {
    const help = cli(['service', '--help']).out;
    // The start options with a value (`--slots <n>`), each given one the start command accepts.
    const values: Record<string, string> = { '<list>': 'container', '<level>': 'warn', '<image>': 'agentplane/sandbox:test', '<specs>': 'x@1' };
    const startOptions = [...cli(['start', '--help']).out.matchAll(/^\s+(--[a-z-]+) (<[a-z]+>)/gm)].map((m) => ({ flag: m[1] as string, value: values[m[2] as string] ?? '600' }));
    expect(startOptions.length).toBeGreaterThan(10);
    const unitDir = mkdtempSync(join(tmpdir(), 'units-'));
    // Each alone, at once: the ones service install takes.
    const installs = await Promise.all(startOptions.map(({ flag, value }) =>
      run(process.execPath, [RUNNER_CLI, 'service', 'install', '--config-dir', pairedDir(), '--unit-dir', mkdtempSync(join(tmpdir(), 'units-')), '--no-systemctl', flag, value], { env: { PATH: process.env.PATH ?? '/usr/bin:/bin', HOME: process.env.HOME ?? '/tmp' } })
        .then(() => true, () => false)));
    const taken = startOptions.filter((_, i) => installs[i]);
    expect(taken.map((o) => o.flag)).toContain('--slots');
    expect(taken.filter(({ flag }) => !help.includes(`[${flag} `)).map((o) => o.flag)).toEqual([]);
    const all = taken.flatMap(({ flag, value }) => [flag, value]);
    expect(cli(['service', 'install', '--config-dir', pairedDir(), '--unit-dir', unitDir, '--no-systemctl', ...all]).status).toBe(0);
    const exec = /^ExecStart=.*$/m.exec(readFileSync(join(unitDir, 'agentplane-runner.service'), 'utf8'))?.[0] ?? '';
    expect(taken.filter(({ flag, value }) => !exec.includes(`${flag} ${value}`)).map((o) => o.flag)).toEqual([]);
  }, 180_000);

  it('refuses to install an unpaired runner, a bad unit name or an unknown action', () => {
    const unitDir = mkdtempSync(join(tmpdir(), 'units-'));
    expect(cli(['service', 'install', '--config-dir', mkdtempSync(join(tmpdir(), 'empty-')), '--unit-dir', unitDir, '--no-systemctl']).out).toMatch(/not paired/);
    expect(cli(['service', 'install', '--config-dir', pairedDir(), '--unit-dir', unitDir, '--no-systemctl', '--name', 'bad name']).status).toBe(2);
    expect(cli(['service', 'restart', '--config-dir', pairedDir()]).status).toBe(2);
  });

  it.skipIf(!analyzePresent && !analyzeRequired)('the unit passes systemd-analyze verify', () => {
    expect(analyzePresent, 'systemd-analyze is not installed (Debian package systemd)').toBe(true);
    const unitDir = mkdtempSync(join(tmpdir(), 'units-'));
    const install = cli(['service', 'install', '--config-dir', pairedDir(), '--unit-dir', unitDir, '--no-systemctl', '--tiers', 'container'], { OTEL_EXPORTER_OTLP_ENDPOINT: 'http://collector:4318' });
    expect(install.status, install.out).toBe(0);
    const r = spawnSync('systemd-analyze', ['verify', join(unitDir, 'agentplane-runner.service')], { encoding: 'utf8' });
    // Only lines about this unit count (a container's own unit files may draw warnings of their own).
    const own = `${r.stdout}${r.stderr}`.split('\n').filter((l) => l.includes('agentplane-runner'));
    expect(r.status, own.join('\n')).toBe(0);
    expect(own).toEqual([]);
  });
});
