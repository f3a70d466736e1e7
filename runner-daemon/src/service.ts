/**
 * `agentplane-runner service install|uninstall|status`: the daemon as a systemd service, the way
 * CI runners (GitHub Actions' `svc.sh`, Buildkite's packages) install theirs. One unit per config
 * dir; stop drains (SIGTERM to the daemon only, then up to the drain deadline before SIGKILL),
 * a crash restarts it (not an exit on a refused credential, code 5), and its structured log lines
 * go to the journal.
 */
import { spawnSync } from 'node:child_process';
import { existsSync, mkdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { userInfo } from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { RUNNER_EXIT } from '@agentplane/protocol';

export interface UnitOptions {
  /** Unit name without `.service` (default `agentplane-runner`). */
  name: string;
  configDir: string;
  /** The account the daemon runs as (needs access to the Docker socket). */
  user: string;
  /** The daemon's drain deadline on stop; systemd waits that long plus a margin. */
  drainDeadlineMs: number;
  /** Extra `start` arguments (e.g. `--slots 4`, `--tiers container`). */
  startArgs: readonly string[];
  /** Absolute paths of node and of this package's cli.js. */
  nodePath: string;
  cliPath: string;
  /** Environment for the daemon (e.g. RUNNER_METRICS_ADDR), written as Environment= lines. */
  environment: Readonly<Record<string, string>>;
}

export const DEFAULT_UNIT_DIR = '/etc/systemd/system';
export const DEFAULT_UNIT_NAME = 'agentplane-runner';
/** systemd waits this long beyond the drain deadline before it kills what is left. */
const STOP_MARGIN_S = 30;

const UNIT_NAME = /^[a-zA-Z0-9:_.@-]{1,200}$/;

/** systemd's quoting for one word of ExecStart= / Environment=. */
function quote(word: string): string {
  if (/^[A-Za-z0-9_@%+=:,./-]+$/.test(word)) return word;
  return `"${word.replace(/\\/g, '\\\\').replace(/"/g, '\\"').replace(/\$/g, '$$$$').replace(/%/g, '%%')}"`;
}

export function validUnitName(name: string): boolean {
  return UNIT_NAME.test(name) && !name.endsWith('.service');
}

/** A user name or numeric uid as `User=` takes it (nothing that could break the unit file's line). */
const USER_NAME = /^[A-Za-z0-9_][A-Za-z0-9_.-]{0,255}\$?$/;

export function validUserName(name: string): boolean {
  return USER_NAME.test(name);
}

/**
 * Whether the account exists on this machine (local or from NSS: `id` asks both); null when that
 * cannot be told (no `id` command).
 */
export function userExists(name: string): boolean | null {
  if (!validUserName(name)) return false;
  const r = spawnSync('id', ['-u', '--', name], { encoding: 'utf8' });
  if (r.error) return null;
  return r.status === 0;
}

/** The unit file text. */
export function renderUnit(o: UnitOptions): string {
  const exec = [o.nodePath, o.cliPath, 'start', '--config-dir', o.configDir, '--drain-deadline-ms', String(o.drainDeadlineMs), ...o.startArgs].map(quote).join(' ');
  const env = Object.entries({ NODE_ENV: 'production', ...o.environment }).map(([k, v]) => `Environment=${quote(`${k}=${v}`)}`);
  return [
    '# Written by `agentplane-runner service install`; `agentplane-runner service uninstall` removes it.',
    '[Unit]',
    `Description=agentplane runner (${o.configDir})`,
    'After=network-online.target docker.service',
    'Wants=network-online.target',
    // Keep restarting however often it fails (the control plane may be down for a while).
    'StartLimitIntervalSec=0',
    '',
    '[Service]',
    'Type=simple',
    `User=${o.user}`,
    ...env,
    `ExecStart=${exec}`,
    // Stop = drain: SIGTERM goes to the daemon alone (not to its sandbox helpers); it stops taking
    // work, finishes what it holds and exits. What is left after the drain deadline is killed.
    'KillMode=mixed',
    'KillSignal=SIGTERM',
    `TimeoutStopSec=${Math.ceil(o.drainDeadlineMs / 1000) + STOP_MARGIN_S}`,
    // A crash (or a non-zero exit) restarts it; a drained exit (code 0) stays stopped, and so does
    // one on a credential the control plane refused for good (code 5): restarted as it is, it
    // would only be refused again. Pair again, then start the unit.
    'Restart=on-failure',
    `RestartPreventExitStatus=${RUNNER_EXIT.credentialRefused}`,
    'RestartSec=5',
    'StandardOutput=journal',
    'StandardError=journal',
    `SyslogIdentifier=${o.name}`,
    '',
    '[Install]',
    'WantedBy=multi-user.target',
    '',
  ].join('\n');
}

export interface ServiceContext {
  unitDir: string;
  /** Run systemctl (false: only write or remove the file, e.g. for an image build or a test). */
  systemctl: boolean;
}

export interface ServiceResult {
  ok: boolean;
  unit: string;
  path: string;
  message: string;
  /** status: whether systemd says the unit is active; null with --no-systemctl (not asked). */
  active?: boolean | null;
  /** `systemctl show` properties, for status. */
  properties?: Record<string, string>;
}

function systemctl(args: string[]): { ok: boolean; out: string } {
  const r = spawnSync('systemctl', args, { encoding: 'utf8' });
  if (r.error) return { ok: false, out: `systemctl: ${r.error.message}` };
  return { ok: r.status === 0, out: `${r.stdout}${r.stderr}`.trim() };
}

export function unitPath(ctx: ServiceContext, name: string): string {
  return join(ctx.unitDir, `${name}.service`);
}

export function installService(ctx: ServiceContext, o: UnitOptions, enable: boolean): ServiceResult {
  const path = unitPath(ctx, o.name);
  mkdirSync(ctx.unitDir, { recursive: true });
  writeFileSync(path, renderUnit(o), { mode: 0o644 });
  const unit = `${o.name}.service`;
  if (!ctx.systemctl) return { ok: true, unit, path, message: `wrote ${path}` };
  const reload = systemctl(['daemon-reload']);
  if (!reload.ok) return { ok: false, unit, path, message: `wrote ${path}; systemctl daemon-reload failed: ${reload.out}` };
  if (!enable) return { ok: true, unit, path, message: `wrote ${path}; start it with: systemctl enable --now ${unit}` };
  const en = systemctl(['enable', '--now', unit]);
  return { ok: en.ok, unit, path, message: en.ok ? `installed and started ${unit}; logs: journalctl -u ${unit} -f` : `wrote ${path}; systemctl enable --now failed: ${en.out}` };
}

export function uninstallService(ctx: ServiceContext, name: string): ServiceResult {
  const path = unitPath(ctx, name);
  const unit = `${name}.service`;
  if (ctx.systemctl && existsSync(path)) {
    // disable --now stops it first: a drain, up to TimeoutStopSec.
    const dis = systemctl(['disable', '--now', unit]);
    if (!dis.ok) return { ok: false, unit, path, message: `systemctl disable --now failed: ${dis.out}` };
  }
  const existed = existsSync(path);
  rmSync(path, { force: true });
  if (ctx.systemctl) systemctl(['daemon-reload']);
  return { ok: true, unit, path, message: existed ? `removed ${unit}` : `${unit} was not installed` };
}

export function serviceStatus(ctx: ServiceContext, name: string): ServiceResult {
  const path = unitPath(ctx, name);
  const unit = `${name}.service`;
  if (!existsSync(path)) return { ok: false, unit, path, active: false, message: `${unit} is not installed (no ${path})` };
  // Without systemctl nobody is asked whether it runs: ok means installed, and active is unknown.
  if (!ctx.systemctl) {
    return {
      ok: true, unit, path, active: null, message: `${unit} is installed at ${path} (whether it is active was not asked: --no-systemctl)`,
      properties: { ExecStart: /^ExecStart=(.*)$/m.exec(readFileSync(path, 'utf8'))?.[1] ?? '' },
    };
  }
  const show = systemctl(['show', unit, '--property=LoadState,ActiveState,SubState,MainPID,NRestarts,ExecMainStartTimestamp']);
  const properties = Object.fromEntries(show.out.split('\n').filter((l) => l.includes('=')).map((l) => [l.slice(0, l.indexOf('=')), l.slice(l.indexOf('=') + 1)]));
  const active = properties.ActiveState === 'active';
  return { ok: show.ok && active, unit, path, active, properties, message: `${unit}: ${properties.ActiveState ?? 'unknown'} (${properties.SubState ?? '?'}), pid ${properties.MainPID ?? '?'}, restarts ${properties.NRestarts ?? '?'}` };
}

/** Defaults from this process: the node binary and the cli.js next to this module, the invoking user. */
export function defaultUnitOptions(configDir: string): Pick<UnitOptions, 'nodePath' | 'cliPath' | 'user' | 'configDir'> {
  return {
    nodePath: process.execPath,
    cliPath: join(dirname(fileURLToPath(import.meta.url)), 'cli.js'),
    user: process.env.SUDO_USER || userInfo().username,
    configDir: resolve(configDir),
  };
}
