#!/usr/bin/env node
import { existsSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { parseArgs } from 'node:util';
import { hostname } from 'node:os';
import type Docker from 'dockerode';
import { apiUrl, ConfigError, createLogger, envInt, startTracing, type Logger } from '@agentplane/core';
import { probeInitialize } from './acp/client.js';
import { AcpHarnesses, installHarness, type InstalledHarness } from './acp/install.js';
import type { SandboxDriver } from './sandbox/types.js';
import { RunnerAgent } from './agent.js';
import { dockerClient } from './capabilities.js';
import { credentialPath, loadCredential, loadDaemonConfig, loadState, saveCredential, type DaemonConfig, type RunnerCredentialFile } from './config.js';
import { runDoctor } from './doctor.js';
import { DEFAULT_UNIT_DIR, DEFAULT_UNIT_NAME, defaultUnitOptions, installService, serviceStatus, uninstallService, validUnitName, type ServiceContext, type ServiceResult } from './service.js';
import { RunnerMetrics, serveMetrics } from './metrics.js';
import { firstWilling, noopExecutor, turnExecutor } from './executors/index.js';
import { SandboxManager } from './sandbox/manager.js';
import { DockerDriver, ensureSandboxImageIfDocker, planReap, reapItems, selectDriver, SandboxReaper, type ReapPlan } from './sandbox/index.js';

const COMMON = `
Common options:
  --config-dir <dir>   where runner.json (0600) and state.json live
                       (default $AGENTPLANE_RUNNER_HOME or ~/.agentplane/runner)
  --json               machine-readable output
  -h, --help           this help`;

const HELP: Record<string, string> = {
  main: `agentplane-runner: the runner daemon

Usage: agentplane-runner <command> [options]

Commands:
  pair     redeem a pairing code and store the runner credential
  enroll   enroll into a managed pool with a runner-role API key
  start    connect to the control plane and serve work (SIGTERM drains)
  status   show the local daemon's state
  drain    ask the running daemon to drain (finish held work, then exit)
  doctor   preflight: control plane, credential, Docker, sandbox image, canary container;
           lists the sandboxes of gone runners that prune would remove
  prune    remove the sandboxes and workspace volumes of gone runners of this machine
  service  install|uninstall|status: run the daemon as a systemd service
${COMMON}`,
  pair: `Usage: agentplane-runner pair --code <code> --url <base url> [--label <name>] [--pool <rpool_id>]

Redeems a single-use pairing code (from POST /v1/runner-pairings) and stores the runner
credential in <config-dir>/runner.json with mode 0600. The owner comes from the pairing.
${COMMON}`,
  enroll: `Usage: agentplane-runner enroll --api-key <runner-role key> --pool <rpool_id> --url <base url> [--label <name>]

Managed pools: mints a runner credential with no owner using a runner-role API key
(POST /v1/runner-pools/{id}/enrollments) and stores it like pair does.
${COMMON}`,
  start: `Usage: agentplane-runner start [--heartbeat-ms <ms>] [--slots <n>] [--drain-deadline-ms <ms>]

Connects with the stored credential and stays connected: reconnects with capped exponential
backoff and jitter (1 s doubling to 64 s), reports honest capabilities and free slots in
heartbeats. SIGTERM: drain (no new work, finish held work, exit). A second SIGTERM, or the
drain deadline (default 1 h), cancels held work. A drain the control plane asks for (a runner or
pool drain through the API) leaves the daemon connected and idle until it is resumed
(POST /v1/runners/{id}/resume, or the pool's resume); --exit-when-drained makes it exit instead.
Options:
  --heartbeat-ms <ms>        override the gateway's heartbeat interval
  --slots <n>                cap on concurrent work (default: CPU count, bounded by free memory)
  --slot-memory-mib <mib>    memory reserved per slot (default 512)
  --drain-deadline-ms <ms>   drain deadline on SIGTERM (default 3600000)
  --exit-when-drained        exit once a control-plane drain has finished the held work
  --tiers <list>             isolation tiers to offer, e.g. container or container,gvisor (default:
                             every tier whose canary sandbox runs: container (runc), gvisor (runsc))
  --acp-harness <specs>      ACP agent harnesses to install into the sandbox image, comma-separated
                             npm package specs (docs/ACP.md; env RUNNER_ACP_HARNESSES)
  --browser                  offer browser observation: sandboxes of browser Environments run the browser
                             image (built offline from this host's Debian chromium when missing), claimed
                             only once a canary browser opened a page, read its accessibility tree and
                             took a screenshot
  --browser-image <image>    the browser image to offer it with (implies --browser)
  --reconnect-base-ms, --reconnect-cap-ms   backoff bounds (default 1000, 64000)
  --sandbox-idle-suspend-seconds <s>   stop an idle Session sandbox's processes (default 600; 0 never)
  --sandbox-idle-expire-seconds <s>    remove an idle Session sandbox and its workspace (default 86400; 0 never)
  --sandbox-report-seconds <s>         how often sandboxes of archived/deleted Sessions are released (default 30)
  --repository-max-mib <mib>           largest repository snapshot fetched for a Session (default 256)
  --sandbox-reap-interval-seconds <s>  how often sandboxes of gone runners of this machine are looked for (default 300; 0 only at start)
  --sandbox-reap-grace-seconds <s>     how long such a sandbox is seen before it is removed (default 900)
  --log-level <level>        pino level (default info)
Environment: AGENTPLANE_RUNNER_HOME, RUNNER_MAX_SLOTS, RUNNER_EXIT_WHEN_DRAINED (true|false), RUNNER_TIERS,
RUNNER_BROWSER (true|false), RUNNER_BROWSER_IMAGE, SANDBOX_IDLE_SUSPEND_SECONDS,
SANDBOX_IDLE_EXPIRE_SECONDS, SANDBOX_REPORT_SECONDS, SANDBOX_REAP_INTERVAL_SECONDS,
SANDBOX_REAP_GRACE_SECONDS, AGENTPLANE_SANDBOX_SCOPE, REPOSITORY_MAX_MIB, DOCKER_SOCKET, LOG_LEVEL,
RUNNER_METRICS_ADDR (host:port serving Prometheus /metrics; unset: not served), OTEL_* (OpenTelemetry
tracing, off by default: OTEL_TRACES_EXPORTER=otlp or OTEL_EXPORTER_OTLP_ENDPOINT turns on OTLP/HTTP export).
Repository resources are fetched on this machine with git (the sandbox has no network), with
this machine's git credentials (HTTPS credential helpers, SSH keys for git@ URLs).
${COMMON}`,
  status: `Usage: agentplane-runner status

Prints the running daemon's status (pid, connected, generation, last heartbeat).
Exit code 0 when connected, 1 otherwise.
${COMMON}`,
  drain: `Usage: agentplane-runner drain [--wait [--timeout <seconds>]]

Sends SIGTERM to the running daemon: it stops taking work, finishes held work and exits.
--wait blocks until it has exited, at most --timeout seconds (default 3600, the daemon's default
drain deadline); exit code 1 when it is still running then. (The control-plane API also drains:
POST /v1/runners/{id}/drain.)
${COMMON}`,
  doctor: `Usage: agentplane-runner doctor [--image <image>]

Checks, each with pass/fail and the fix: paired, control plane reachable, runner credential
accepted, Docker engine answers, sandbox image present, canary container starts and is torn down,
git available (repository resources are cloned on this machine). Then lists the sandboxes and
workspace volumes \`prune\` would remove (never fails a check).
Exit code 0 when every check passes.
${COMMON}`,
  service: `Usage: agentplane-runner service install|uninstall|status [--name <unit>] [--user <user>]
                                [--unit-dir <dir>] [--no-start] [--no-systemctl]
                                [--slots <n>] [--tiers <list>] [--drain-deadline-ms <ms>] [--log-level <level>]

install writes a systemd unit (<unit-dir>/<name>.service; default /etc/systemd/system/
agentplane-runner.service, so run it as root) that runs \`agentplane-runner start\` on this config
dir as --user (default: the invoking user, $SUDO_USER under sudo; it needs the Docker socket), then
enables and starts it. The unit restarts the daemon on failure (every 5 s, without limit); stopping
it (systemctl stop, uninstall, shutdown) drains: SIGTERM to the daemon, which finishes held work
up to its drain deadline, then systemd kills what is left (TimeoutStopSec = deadline + 30 s).
Logs go to the journal: journalctl -u <name> -f. These variables, when set at install time, are
written into the unit: RUNNER_METRICS_ADDR, RUNNER_MAX_SLOTS, RUNNER_TIERS, RUNNER_EXIT_WHEN_DRAINED,
DOCKER_SOCKET, HTTPS_PROXY, HTTP_PROXY, NO_PROXY, AGENTPLANE_SANDBOX_SCOPE, OTEL_*.
uninstall stops (drains) and disables the unit and removes the file; status shows its state.
Several runners on one machine: one config dir and one --name each.
Options:
  --name <unit>       unit name without .service (default agentplane-runner)
  --unit-dir <dir>    where the unit file goes (default /etc/systemd/system)
  --no-start          write and load the unit, do not enable or start it
  --no-systemctl      only write (or remove) the file; no systemctl calls (image builds, checks)
Exit code 0 on success; status: 0 when the service is active.
${COMMON}`,
  prune: `Usage: agentplane-runner prune [--dry-run]

Removes the sandbox containers and workspace volumes of runners of this machine that are gone:
their credential file no longer exists (its data directory was deleted, or it was re-paired), or
their control plane refuses the credential (revoked). Only containers and volumes labelled
agentplane.managed=true are considered; those of runners that are live, whose control plane
cannot be reached, of other hosts, or made by runners too old to record their home are kept.
The running daemon does the same by itself after a grace period (--sandbox-reap-grace-seconds).
Options:
  --dry-run   list what would be removed, remove nothing
Environment: AGENTPLANE_SANDBOX_SCOPE (only that scope's sandboxes), DOCKER_SOCKET.
Exit code 0 when everything planned was removed.
${COMMON}`,
};

type Flags = Record<string, string | boolean>;

function parse(argv: string[]): { command: string; flags: Flags } {
  const { values, positionals } = parseArgs({
    args: argv,
    allowPositionals: true,
    strict: true,
    options: {
      help: { type: 'boolean', short: 'h' },
      json: { type: 'boolean' },
      wait: { type: 'boolean' },
      timeout: { type: 'string' },
      'dry-run': { type: 'boolean' },
      'config-dir': { type: 'string' },
      code: { type: 'string' },
      url: { type: 'string' },
      label: { type: 'string' },
      pool: { type: 'string' },
      'api-key': { type: 'string' },
      image: { type: 'string' },
      'heartbeat-ms': { type: 'string' },
      slots: { type: 'string' },
      'slot-memory-mib': { type: 'string' },
      'drain-deadline-ms': { type: 'string' },
      'exit-when-drained': { type: 'boolean' },
      tiers: { type: 'string' },
      'acp-harness': { type: 'string' },
      browser: { type: 'boolean' },
      'browser-image': { type: 'string' },
      'reconnect-base-ms': { type: 'string' },
      'reconnect-cap-ms': { type: 'string' },
      'sandbox-idle-suspend-seconds': { type: 'string' },
      'sandbox-idle-expire-seconds': { type: 'string' },
      'sandbox-report-seconds': { type: 'string' },
      'repository-max-mib': { type: 'string' },
      'sandbox-reap-interval-seconds': { type: 'string' },
      'sandbox-reap-grace-seconds': { type: 'string' },
      'log-level': { type: 'string' },
      name: { type: 'string' },
      user: { type: 'string' },
      'unit-dir': { type: 'string' },
      'no-start': { type: 'boolean' },
      'no-systemctl': { type: 'boolean' },
    },
  });
  if (positionals[0] === 'service') return { command: 'service', flags: { ...(values as Flags), action: positionals[1] ?? '' } };
  return { command: positionals[0] ?? 'help', flags: values as Flags };
}

const out = (flags: Flags, human: string, data: unknown): void => {
  process.stdout.write(flags.json ? `${JSON.stringify(data)}\n` : `${human}\n`);
};

async function redeemOrEnroll(command: 'pair' | 'enroll', flags: Flags): Promise<number> {
  const config = loadDaemonConfig(process.env, flags);
  const url = flags.url;
  if (typeof url !== 'string') throw new UsageError('--url is required');
  if (!URL.canParse(url) || !/^https?:$/.test(new URL(url).protocol)) throw new UsageError(`--url must be an http(s) URL, got '${url}'`);
  const label = typeof flags.label === 'string' ? flags.label : hostname();
  let res: Response;
  if (command === 'pair') {
    if (typeof flags.code !== 'string') throw new UsageError('--code is required');
    res = await fetch(apiUrl(url, '/v1/runner-pairings/redeem'), {
      method: 'POST',
      headers: { 'content-type': 'application/json', 'service-version': '2026-08-27' },
      body: JSON.stringify({
        code: flags.code,
        runner_enrollment: { placement: 'byoc', display_name: label, ...(typeof flags.pool === 'string' ? { runner_pool_id: flags.pool } : {}) },
      }),
    });
  } else {
    if (typeof flags['api-key'] !== 'string' || typeof flags.pool !== 'string') throw new UsageError('--api-key and --pool are required');
    res = await fetch(apiUrl(url, `/v1/runner-pools/${encodeURIComponent(flags.pool)}/enrollments`), {
      method: 'POST',
      headers: {
        'content-type': 'application/json', 'service-version': '2026-08-27', authorization: `Bearer ${flags['api-key']}`,
        'idempotency-key': `enroll-${label}-${Date.now()}`,
      },
      body: JSON.stringify({ machine_label: label }),
    });
  }
  const body = (await res.json().catch(() => ({}))) as {
    secret?: string;
    runner_credential?: { id: string; runner_id: string; runner_pool_id: string; workspace_id: string };
    error?: { type: string; message: string };
  };
  if (res.status !== 201 || !body.secret || !body.runner_credential) {
    out(flags, `${command} failed: HTTP ${res.status} ${body.error?.type ?? ''} ${body.error?.message ?? ''}`.trim(), { ok: false, status: res.status, error: body.error ?? null });
    return 1;
  }
  const rc = body.runner_credential;
  const file: RunnerCredentialFile = {
    base_url: url, secret: body.secret, runner_id: rc.runner_id, runner_credential_id: rc.id, runner_pool_id: rc.runner_pool_id,
    workspace_id: rc.workspace_id, machine_label: label, paired_at: new Date().toISOString(),
  };
  const path = saveCredential(config.configDir, file);
  out(flags, `paired: runner ${rc.runner_id} in pool ${rc.runner_pool_id}\ncredential stored in ${path} (mode 0600)\nnext: agentplane-runner start`, {
    ok: true, runner_id: rc.runner_id, runner_credential_id: rc.id, runner_pool_id: rc.runner_pool_id, workspace_id: rc.workspace_id, path,
  });
  return 0;
}

async function prepareAcpHarnesses(config: DaemonConfig, driver: SandboxDriver, docker: Docker | undefined, log: Logger): Promise<AcpHarnesses> {
  const installed: InstalledHarness[] = [];
  for (const spec of config.acpHarnesses) {
    try {
      installed.push(await installHarness(spec, join(config.configDir, 'acp'), log));
    } catch (err) {
      log.warn({ harness: spec, err: err instanceof Error ? err.message : String(err) }, 'ACP harness could not be installed');
    }
  }
  const acp = new AcpHarnesses(installed, docker, log);
  await acp.probe(driver, config.sandboxImage, (d, sandbox, argv) => probeInitialize(d, sandbox, argv));
  return acp;
}

async function start(flags: Flags): Promise<number> {
  const config = loadDaemonConfig(process.env, flags);
  const cred = loadCredential(config.configDir);
  if (!cred) throw new UsageError(`no runner credential at ${credentialPath(config.configDir)}; run \`agentplane-runner pair\` first`, false);
  const log = createLogger({ name: 'runner', level: config.logLevel }).child({ runner: cred.runner_id });
  const tracing = await startTracing('agentplane-runner', log);
  const docker = dockerClient(config.dockerSocket);
  const agent = new RunnerAgent(cred, config, log, docker);
  // Prometheus metrics on an optional listen address (off unless RUNNER_METRICS_ADDR is set).
  const metrics = new RunnerMetrics(() => agent.heldCount, { served: Boolean(config.metricsAddr) });
  agent.metrics = metrics;
  const metricsServer = config.metricsAddr ? await serveMetrics(metrics.registry, config.metricsAddr, log) : undefined;
  let reaper: SandboxReaper | undefined;
  // The sandbox: Docker when the engine answers (image built offline if missing), else the
  // unisolated process driver. Orphans of an earlier life of this runner are reaped first.
  const image = await ensureSandboxImageIfDocker({ docker, onProgress: (line: string) => log.info(line) }).catch((err: unknown) => {
    log.warn({ err: err instanceof Error ? err.message : String(err) }, 'sandbox image could not be built');
    return undefined;
  });
  const driver = await selectDriver({
    runnerId: cred.runner_id, dataDir: join(config.configDir, 'sandboxes'), docker, logger: log,
    attribution: { workspaceId: cred.workspace_id, home: config.configDir, ...(config.sandboxScope ? { scope: config.sandboxScope } : {}) },
    ...(config.tiers ? { tiers: config.tiers } : {}),
    ...(config.browserImage ? { browserImage: config.browserImage } : {}),
  });
  const sandboxes = driver
    ? new SandboxManager({
        driver, runnerId: cred.runner_id, logger: log,
        idleSuspendMs: config.sandboxIdleSuspendMs, idleExpireMs: config.sandboxIdleExpireMs,
      })
    : undefined;
  if (sandboxes && driver) {
    const reaped = await sandboxes.start().catch((err: unknown) => {
      log.warn({ err: err instanceof Error ? err.message : String(err) }, 'could not reap sandboxes of an earlier run');
      return [] as string[];
    });
    if (reaped.length > 0) log.info({ reaped: reaped.length, kept_workspaces: sandboxes.sessions().length }, 'stopped sandboxes left by an earlier run of this runner');
    // ACP agent harnesses: installed with npm on this machine, layered into the sandbox image, probed.
    const acp = config.acpHarnesses.length > 0 ? await prepareAcpHarnesses(config, driver, driver instanceof DockerDriver ? docker : undefined, log) : undefined;
    if (acp) agent.acpSource = () => ({ driver: driver.name, harnesses: acp.report() });
    agent.executor = firstWilling(turnExecutor({ sandboxes, log, baseUrl: cred.base_url, repositoryMaxBytes: config.repositoryMaxBytes, metrics, ...(acp ? { acp } : {}) }), noopExecutor);
    if (driver instanceof DockerDriver) {
      // Claim a tier only after a canary sandbox ran under it; re-checked with every capability refresh.
      const verdicts = await driver.verifyTiers();
      for (const v of verdicts) (v.ok ? log.info : log.warn).call(log, { tier: v.tier, runtime: v.runtime ?? 'default', ms: v.ms, detail: v.detail }, v.ok ? 'isolation tier verified' : 'isolation tier unavailable');
      agent.tierSource = async () => (await driver.verifyTiers()).filter((v) => v.ok).map((v) => v.tier);
      if (driver.browserImage) {
        // Browser observation is claimed only once a canary browser ran in a sandbox of its image.
        const b = await driver.verifyBrowser();
        (b.accessibility_tree && b.screenshot ? log.info : log.warn).call(log, { image: driver.browserImage, ms: b.ms, detail: b.detail }, b.accessibility_tree && b.screenshot ? 'browser observation verified' : 'browser observation unavailable');
        agent.browserSource = async () => {
          const v = await driver.verifyBrowser();
          return { accessibility_tree: v.accessibility_tree, screenshot: v.screenshot };
        };
      }
    }
    log.info({ driver: driver.name, tiers: driver.capabilities().tiers, image: image?.latest }, 'sandbox driver ready');
    // Sandboxes of gone runners of this machine (credential deleted or revoked) go after a grace period.
    if (driver.name === 'docker') {
      reaper = new SandboxReaper({
        docker, scope: config.sandboxScope, selfRunnerId: cred.runner_id, graceMs: config.sandboxReapGraceMs,
        intervalMs: config.sandboxReapIntervalMs, logger: log,
      });
      reaper.start();
    }
  } else {
    agent.executor = noopExecutor;
  }
  let signals = 0;
  const onSignal = (sig: string) => {
    signals += 1;
    if (signals === 1) {
      log.info({ signal: sig }, 'drain requested by signal; finishing held work (send again to cancel it)');
      agent.beginDrain(Date.now() + config.drainDeadlineMs, `${sig} received`);
    } else if (agent.heldCount === 0) {
      // A terminal's Ctrl-C reaches the runner and its supervisor, which signals it again: not news.
      log.info({ signal: sig }, 'second signal: nothing held; stopping');
      agent.cancelAll(`${sig} received twice`);
    } else {
      log.warn({ signal: sig, held: agent.heldCount }, 'second signal: canceling held work');
      agent.cancelAll(`${sig} received twice`);
    }
  };
  process.on('SIGTERM', () => onSignal('SIGTERM'));
  process.on('SIGINT', () => onSignal('SIGINT'));
  await agent.run();
  reaper?.stop();
  // A clean stop leaves no process running; the workspaces of live Sessions stay (durable
  // retention) and are released when their Session ends or their idle time expires.
  if (sandboxes) {
    await sandboxes.shutdown();
    log.info({ kept_workspaces: sandboxes.sessions().length }, 'stopped this runner\'s sandboxes');
  }
  metricsServer?.close();
  await tracing.shutdown();
  log.info('runner stopped');
  return 0;
}

function alive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
}

function status(flags: Flags): number {
  const config = loadDaemonConfig(process.env, flags);
  const cred = loadCredential(config.configDir);
  const state = loadState(config.configDir);
  const running = !!state && state.status !== 'stopped' && alive(state.pid);
  const data = {
    paired: !!cred, runner_id: cred?.runner_id ?? null, runner_pool_id: cred?.runner_pool_id ?? null, base_url: cred?.base_url ?? null,
    running, pid: running ? state!.pid : null, status: running ? state!.status : 'stopped', connected: running && state!.connected,
    generation: running ? state!.generation : null, last_heartbeat_ack_at: state?.last_heartbeat_ack_at ?? null,
  };
  const human = !cred
    ? 'not paired (run `agentplane-runner pair`)'
    : [
        `runner      ${data.runner_id}`,
        `pool        ${data.runner_pool_id}`,
        `control     ${data.base_url}`,
        `daemon      ${running ? `running (pid ${data.pid})` : 'not running'}`,
        `status      ${data.status}${data.connected ? `, connected (generation ${data.generation})` : running ? ', disconnected (reconnecting)' : ''}`,
        `last ack    ${data.last_heartbeat_ack_at ?? '-'}`,
      ].join('\n');
  out(flags, human, data);
  return data.connected ? 0 : 1;
}

async function drain(flags: Flags): Promise<number> {
  const config = loadDaemonConfig(process.env, flags);
  const timeoutMs = envInt({ '--timeout': typeof flags.timeout === 'string' ? flags.timeout : undefined }, '--timeout', 3600, 0) * 1000;
  const state = loadState(config.configDir);
  if (!state || state.status === 'stopped' || !alive(state.pid)) {
    out(flags, 'no running daemon', { ok: false, running: false });
    return 1;
  }
  process.kill(state.pid, 'SIGTERM');
  if (!flags.wait) {
    out(flags, `drain requested (pid ${state.pid})`, { ok: true, pid: state.pid, exited: false });
    return 0;
  }
  const deadline = Date.now() + timeoutMs;
  while (alive(state.pid) && Date.now() < deadline) await new Promise((r) => setTimeout(r, Math.min(200, Math.max(1, deadline - Date.now()))));
  if (alive(state.pid)) {
    out(flags, `daemon ${state.pid} still running after ${timeoutMs / 1000} s (it is draining; wait again or see \`agentplane-runner status\`)`, {
      ok: false, pid: state.pid, exited: false, timed_out: true,
    });
    return 1;
  }
  out(flags, `daemon ${state.pid} drained and exited`, { ok: true, pid: state.pid, exited: true });
  return 0;
}

/** What `prune` would remove: managed sandboxes of gone runners of this machine (this runner's own excluded). */
async function plan(config: DaemonConfig): Promise<ReapPlan> {
  const cred = loadCredential(config.configDir);
  return planReap({ docker: dockerClient(config.dockerSocket), scope: config.sandboxScope, selfRunnerId: cred?.runner_id });
}

const describeItem = (i: ReapPlan['reapable'][number]): string =>
  `${i.kind === 'container' ? 'container' : 'volume   '}  ${i.name}  (runner ${i.runner}, session ${i.session}: ${i.reason.replace('_', ' ')})`;

async function doctor(flags: Flags): Promise<number> {
  const config = loadDaemonConfig(process.env, flags);
  const checks = await runDoctor(config, loadCredential(config.configDir), dockerClient(config.dockerSocket));
  const ok = checks.every((c) => c.ok);
  const human = checks.map((c) => `${c.ok ? 'PASS' : 'FAIL'}  ${c.name}: ${c.detail}${!c.ok && c.fix ? `\n      fix: ${c.fix}` : ''}`).join('\n');
  // What prune would remove (not a check: leftovers never fail the doctor); skipped without Docker.
  const reap = await plan(config).catch(() => undefined);
  const reapText = !reap
    ? ''
    : reap.reapable.length === 0
      ? '\nnothing to prune: no sandboxes of gone runners on this machine'
      : `\nprune would remove ${reap.reapable.length} item(s) of gone runners (run \`agentplane-runner prune\`):\n${reap.reapable.map((i) => `  ${describeItem(i)}`).join('\n')}`;
  out(flags, `${human}\n${ok ? 'all checks passed' : 'some checks failed'}${reapText}`, { ok, checks, prune: reap ?? null });
  return ok ? 0 : 1;
}

async function prune(flags: Flags): Promise<number> {
  const config = loadDaemonConfig(process.env, flags);
  const p = await plan(config);
  const dry = !!flags['dry-run'];
  if (dry) {
    out(flags, p.reapable.length === 0 ? 'nothing to prune' : `would remove:\n${p.reapable.map((i) => `  ${describeItem(i)}`).join('\n')}`, {
      ok: true, dry_run: true, scope: p.scope, would_remove: p.reapable, runners: p.runners, kept: p.kept,
    });
    return 0;
  }
  const result = await reapItems(dockerClient(config.dockerSocket), p.reapable);
  const ok = result.failed.length === 0;
  const human = [
    result.reaped.length === 0 ? 'nothing pruned' : `removed:\n${result.reaped.map((i) => `  ${describeItem(i)}`).join('\n')}`,
    ...(ok ? [] : [`failed:\n${result.failed.map((i) => `  ${describeItem(i)}: ${i.error}`).join('\n')}`]),
  ].join('\n');
  out(flags, human, { ok, dry_run: false, scope: p.scope, removed: result.reaped, failed: result.failed, runners: p.runners, kept: p.kept });
  return ok ? 0 : 1;
}

/** A mistake in how the command was called: exit code 2, with the command's usage. */
class UsageError extends Error {
  constructor(message: string, readonly showUsage = true) {
    super(message);
  }
}

const SERVICE_ENV = /^(RUNNER_METRICS_ADDR|RUNNER_MAX_SLOTS|RUNNER_TIERS|RUNNER_EXIT_WHEN_DRAINED|DOCKER_SOCKET|HTTPS?_PROXY|NO_PROXY|AGENTPLANE_SANDBOX_SCOPE|OTEL_[A-Z0-9_]+)$/;

function service(flags: Flags): number {
  const action = flags.action;
  const config = loadDaemonConfig(process.env, flags);
  const name = typeof flags.name === 'string' ? flags.name : DEFAULT_UNIT_NAME;
  if (!validUnitName(name)) throw new UsageError(`--name '${name}' is not a unit name (letters, digits, :_.@-; without .service)`);
  const ctx: ServiceContext = { unitDir: typeof flags['unit-dir'] === 'string' ? resolve(flags['unit-dir']) : DEFAULT_UNIT_DIR, systemctl: !flags['no-systemctl'] };
  let r: ServiceResult;
  if (action === 'install') {
    if (!existsSync(credentialPath(config.configDir))) throw new UsageError(`not paired: no credential in ${config.configDir} (run pair or enroll first)`, false);
    const startArgs: string[] = [];
    for (const f of ['slots', 'tiers', 'slot-memory-mib', 'heartbeat-ms', 'log-level'] as const) if (typeof flags[f] === 'string') startArgs.push(`--${f}`, flags[f]);
    const deadline = typeof flags['drain-deadline-ms'] === 'string' ? Number(flags['drain-deadline-ms']) : 3_600_000;
    if (!Number.isInteger(deadline) || deadline < 0) throw new UsageError('--drain-deadline-ms must be a non-negative integer');
    const environment = Object.fromEntries(Object.entries(process.env).filter((e): e is [string, string] => SERVICE_ENV.test(e[0]) && typeof e[1] === 'string'));
    r = installService(ctx, {
      ...defaultUnitOptions(config.configDir), name, drainDeadlineMs: deadline, startArgs, environment,
      ...(typeof flags.user === 'string' ? { user: flags.user } : {}),
    }, !flags['no-start']);
  } else if (action === 'uninstall') {
    r = uninstallService(ctx, name);
  } else if (action === 'status') {
    r = serviceStatus(ctx, name);
  } else {
    throw new UsageError(`service needs install, uninstall or status (got '${String(action)}')`);
  }
  out(flags, r.message, r);
  return r.ok ? 0 : 1;
}

type CommandName = 'pair' | 'enroll' | 'start' | 'status' | 'drain' | 'doctor' | 'prune' | 'service';
const COMMANDS = new Map<string, (flags: Flags) => Promise<number> | number>([
  ['pair', (f) => redeemOrEnroll('pair', f)],
  ['enroll', (f) => redeemOrEnroll('enroll', f)],
  ['start', start],
  ['status', status],
  ['drain', drain],
  ['doctor', doctor],
  ['prune', prune],
  ['service', service],
] satisfies Array<[CommandName, (flags: Flags) => Promise<number> | number]>);

/** Why a command failed, for `--json`: `usage` and `config` exit 2, `network` and `internal` exit 1. */
function classify(err: unknown): { type: 'usage' | 'config' | 'network' | 'internal'; message: string; code: number } {
  const message = err instanceof Error ? err.message : String(err);
  if (err instanceof UsageError) return { type: 'usage', message, code: 2 };
  if (err instanceof ConfigError) return { type: 'config', message, code: 2 };
  // fetch() rejects with a TypeError whose cause carries the socket error (ECONNREFUSED, ENOTFOUND, …).
  const cause = (err as { cause?: { code?: string; message?: string } } | null)?.cause;
  if (err instanceof TypeError && cause) return { type: 'network', message: `${message}: ${cause.code ?? cause.message ?? 'network error'}`, code: 1 };
  if (typeof (err as { code?: unknown } | null)?.code === 'string' && /^E[A-Z]+/.test((err as { code: string }).code)) return { type: 'network', message, code: 1 };
  return { type: 'internal', message, code: 1 };
}

function fail(json: boolean, command: string | undefined, err: unknown): number {
  const e = classify(err);
  if (json) {
    process.stdout.write(`${JSON.stringify({ ok: false, error: { type: e.type, message: e.message } })}\n`);
  } else {
    const usage = err instanceof UsageError && err.showUsage ? `\n\n${(command && HELP[command]) || HELP.main}` : '';
    process.stderr.write(`agentplane-runner${command ? ` ${command}` : ''}: ${e.message}${usage}\n`);
  }
  return e.code;
}

async function main(argv: string[]): Promise<number> {
  let parsed: { command: string; flags: Flags };
  try {
    parsed = parse(argv);
  } catch (err) {
    // The flags did not parse, so --json is looked for in the raw arguments.
    return fail(argv.includes('--json'), undefined, new UsageError(err instanceof Error ? err.message : String(err)));
  }
  const { command, flags } = parsed;
  const json = !!flags.json;
  if (command === 'help') {
    process.stdout.write(`${HELP.main}\n`);
    return 0;
  }
  const run = COMMANDS.get(command);
  if (!run) return fail(json, undefined, new UsageError(`unknown command '${command}'`));
  if (flags.help) {
    process.stdout.write(`${HELP[command]}\n`);
    return 0;
  }
  try {
    return await run(flags);
  } catch (err) {
    return fail(json, command, err);
  }
}

main(process.argv.slice(2)).then(
  (code) => process.exit(code),
  (err: unknown) => {
    process.stderr.write(`agentplane-runner: ${err instanceof Error ? err.message : String(err)}\n`);
    process.exit(1);
  },
);
