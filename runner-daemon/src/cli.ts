#!/usr/bin/env node
import { channel } from 'node:diagnostics_channel';
import { existsSync, rmSync } from 'node:fs';
import { resolve } from 'node:path';
import { parseArgs } from 'node:util';
import { hostname } from 'node:os';
import { ConfigError, createLogger, envInt, startTracing } from '@agentplane/core';
import { credentialPath, loadCredential, loadState, RUNNER_EXIT, type CredentialRefusal } from '@agentplane/protocol';
import { dockerAvailable, dockerClient, planReap, reapItems, type ReapPlan } from '@agentplane/sandbox';
import { RunnerAgent } from './agent.js';
import { classify, CliError, credentialRefused, UsageError } from './cli-errors.js';
import { loadDaemonConfig, type DaemonConfig } from './config.js';
import { DaemonSandboxes, DockerUnavailableError } from './daemon-sandboxes.js';
import { runDoctor } from './doctor.js';
import { DockerCheck, runnerHealth } from './health.js';
import { acquireDaemonLock, claimDrainRequest, clearDrainRequests, drainRequestedAt, drainRequestPath, processLive } from './lock.js';
import { redeemOrEnroll } from './pair.js';
import { DEFAULT_UNIT_DIR, DEFAULT_UNIT_NAME, defaultUnitOptions, installService, serviceStatus, uninstallService, userExists, validUnitName, validUserName, type ServiceContext, type ServiceResult } from './service.js';
import { RunnerMetrics, serveMetrics } from './metrics.js';

const COMMON = `
Common options:
  --config-dir <dir>   where runner.json (0600), state.json and daemon.lock live
                       (default $AGENTPLANE_RUNNER_HOME or ~/.agentplane/runner)
  --json               machine-readable output; errors too: {"ok": false, "error": {"type", "message"}}
                       with type usage or config (exit code 2; config includes a disk that is full,
                       read-only or not writable), network, api (the control plane refused; its own
                       error in error.api_error), not_running (drain: no daemon), already_running
                       (exit code 3), docker_unavailable (start --require-docker, prune: exit code 4),
                       credential_refused (start: the control plane refused the runner credential
                       for good: exit code 5) or internal (exit code 1)
  -h, --help           this help`;

const HELP: Record<string, string> = {
  main: `agentplane-runner: the runner daemon

Usage: agentplane-runner <command> [options]
       agentplane-runner help [<command>]     (or <command> --help)

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
Without a command: this help on standard error, exit code 2.
${COMMON}`,
  pair: `Usage: agentplane-runner pair --code <code> --url <base url> [--label <name>] [--pool <rpool_id>]
                             [--force] [--timeout <seconds>]

Redeems a single-use pairing code (from POST /v1/runner-pairings) and stores the runner
credential in <config-dir>/runner.json with mode 0600, the config dir made 0700. The owner comes
from the pairing. Before the code is used: the config dir must take a test write (a disk that is
full or read-only fails here, error type config, exit code 2, the code still unused), no daemon
may be running on it (exit code 3), and it must not hold a credential already.
If the credential cannot be stored after all, its id is printed so that it can be revoked
(POST /v1/runner-credentials/{id}/revoke); on a terminal its secret is shown once.
Options:
  --code <code>        the pairing code (XXXX-XXXX-XXXX-XXXX), single-use
  --url <base url>     the control plane's address (a base path allowed: https://host/agentplane)
  --label <name>       the runner's display name in the control plane (default: this machine's
                       host name); the pairing's machine_label names the machine it was made for
  --pool <rpool_id>    another BYOC pool of the pairing's Workspace to join (default: the pool
                       the pairing was made for)
  --force              replace the credential the config dir holds (the old one stays active
                       until revoked: its id is printed)
  --timeout <seconds>  how long to wait for the control plane's answer (default 30)
Errors name the URL: no answer in time, a refused connection, a TLS certificate this machine
does not trust (a private CA: NODE_EXTRA_CA_CERTS=<ca.pem>).
${COMMON}`,
  enroll: `Usage: agentplane-runner enroll --api-key <runner-role key> --pool <rpool_id> --url <base url> [--label <name>]
                               [--force] [--timeout <seconds>]

Managed pools: mints a runner credential with no owner using a runner-role API key
(POST /v1/runner-pools/{id}/enrollments) and stores it like pair does, with the same checks
first and the same --force and --timeout.
Options:
  --api-key <key>      an API key with the runner role, used for this request only (not stored)
  --pool <rpool_id>    the managed pool the runner joins
  --url <base url>     the control plane's address (a base path allowed)
  --label <name>       the runner's machine label (default: this machine's host name)
  --force              replace the credential the config dir holds (as for pair)
  --timeout <seconds>  how long to wait for the control plane's answer (default 30)
${COMMON}`,
  start: `Usage: agentplane-runner start [--image <image>] [--slots <n>] [--drain-deadline-ms <ms>] [options below]

One daemon per config dir: start refuses (exit code 3, error type already_running) while a live
daemon holds <config-dir>/daemon.lock; an entry left by a daemon that is gone (kill -9, a crash)
is removed. Starting (sandbox image check, canary sandboxes: often 20 s or more) shows as status
starting; SIGTERM or SIGINT then stops it at once (exit code 0). Sandboxes run in Docker; when the
engine does not answer at start, the daemon uses the unisolated process driver, tries Docker
again with backoff (the reconnect bounds below) and switches to it once it answers;
--require-docker makes it exit instead (exit code 4, error type docker_unavailable).
Connects with the stored credential and stays connected: reconnects with capped exponential
backoff and jitter (1 s doubling to 64 s), reports honest capabilities and free slots in
heartbeats. SIGTERM: drain (no new work, finish held work, exit). A second SIGTERM, or the
drain deadline (default 1 h), cancels held work. A drain the control plane asks for (a runner or
pool drain through the API) leaves the daemon connected and idle until it is resumed
(POST /v1/runners/{id}/resume, or the pool's resume); --exit-when-drained makes it exit instead.
A control plane that refuses the credential (HTTP 401 or 403 on the connect: revoked, deleted, its
owner or Workspace disabled) twice in a row, the second time after a short retry, stops the
daemon: held work is canceled, its sandboxes stopped, one line on stderr says to pair again
(pair --force) and the exit code is 5 (error type credential_refused), which the systemd unit
of \`service install\` and the platform do not restart. A single refusal, or a 5xx (a control
plane starting up), only makes it reconnect.
With RUNNER_METRICS_ADDR set, GET /healthz there answers 200 when the daemon can take work and 503
while it is starting, disconnected from the control plane, stopping on a refused credential, or
its Docker engine does not answer: {"status", "connected", "driver", "docker_ok", "draining", "tiers"}.
Options:
  --image <image>            the sandbox image (default agentplane/sandbox:latest; env SANDBOX_IMAGE)
  --heartbeat-ms <ms>        override the gateway's heartbeat interval
  --slots <n>                cap on concurrent work, 1 to 1024 (default: CPU count; always bounded
                             by free memory); to take no work, drain the runner instead
  --slot-memory-mib <mib>    memory reserved per slot (default 512)
  --drain-deadline-ms <ms>   drain deadline on SIGTERM (default 3600000)
  --exit-when-drained        exit once a control-plane drain has finished the held work
  --require-docker           exit (code 4) when Docker does not answer at start, instead of running
                             sandboxes unisolated with the process driver
  --tiers <list>             isolation tiers to offer, e.g. container or container,gvisor (default:
                             every tier whose canary sandbox runs: container (runc), gvisor (runsc))
  --acp-harness <specs>      ACP agent harnesses to install into the sandbox image, comma-separated
                             npm package specs (docs/ACP.md; env RUNNER_ACP_HARNESSES)
  --browser                  offer browser observation: sandboxes of browser Environments run the browser
                             image (built offline from this host's Debian chromium when missing), claimed
                             only once a canary browser opened a page, read its accessibility tree and
                             took a screenshot
  --browser-image <image>    the browser image to offer it with (implies --browser)
  --egress-allow-private-networks   let sandboxes of allowlist Environments reach listed hosts on private
                             and reserved addresses (this machine's loopback and LAN included); by
                             default the egress proxy connects to public addresses only
  --reconnect-base-ms, --reconnect-cap-ms   backoff bounds (default 1000, 64000) of reconnects, and of
                             Docker retries after a start without it
  --sandbox-idle-suspend-seconds <s>   stop an idle Session sandbox's processes (default 600; 0 never)
  --sandbox-idle-expire-seconds <s>    remove an idle Session sandbox and its workspace (default 86400; 0 never)
  --sandbox-report-seconds <s>         how often sandboxes of archived/deleted Sessions are released (default 30)
  --repository-max-mib <mib>           largest repository snapshot fetched for a Session (default 256)
  --sandbox-reap-interval-seconds <s>  how often sandboxes of gone runners of this machine are looked for (default 300; 0 only at start)
  --sandbox-reap-grace-seconds <s>     how long such a sandbox is seen before it is removed (default 900)
  --log-level <level>        pino level (default info)
Environment (each the same as its option): AGENTPLANE_RUNNER_HOME, SANDBOX_IMAGE, RUNNER_MAX_SLOTS,
RUNNER_SLOT_MEMORY_MIB, RUNNER_HEARTBEAT_INTERVAL_MS, RUNNER_DRAIN_DEADLINE_MS, RUNNER_RECONNECT_BASE_MS,
RUNNER_RECONNECT_CAP_MS, RUNNER_EXIT_WHEN_DRAINED (true|false), RUNNER_REQUIRE_DOCKER (true|false),
RUNNER_TIERS, RUNNER_ACP_HARNESSES, RUNNER_BROWSER (true|false), RUNNER_BROWSER_IMAGE,
RUNNER_EGRESS_ALLOW_PRIVATE_NETWORKS (true|false), SANDBOX_IDLE_SUSPEND_SECONDS,
SANDBOX_IDLE_EXPIRE_SECONDS, SANDBOX_REPORT_SECONDS, SANDBOX_REAP_INTERVAL_SECONDS,
SANDBOX_REAP_GRACE_SECONDS, AGENTPLANE_SANDBOX_SCOPE, REPOSITORY_MAX_MIB, DOCKER_SOCKET, LOG_LEVEL,
RUNNER_METRICS_ADDR (host:port serving Prometheus /metrics and /healthz; unset: not served), OTEL_* (OpenTelemetry
tracing, off by default: OTEL_TRACES_EXPORTER=otlp or OTEL_EXPORTER_OTLP_ENDPOINT turns on OTLP/HTTP export).
Repository resources are fetched on this machine with git (the sandbox has no network), with
this machine's git credentials (HTTPS credential helpers, SSH keys for git@ URLs).
${COMMON}`,
  status: `Usage: agentplane-runner status

Prints the running daemon's status (pid, starting/ready/draining/disconnected, connected,
generation, last heartbeat), or that the daemon stopped because the control plane refused its
credential (credential_refused: pair again with pair --force).
Exit code 0 when connected, 1 otherwise (also while starting).
${COMMON}`,
  drain: `Usage: agentplane-runner drain [--wait [--timeout <seconds>]] [--cancel]

Sends SIGTERM to the running daemon: it stops taking work, finishes held work and exits (held work
still running at its drain deadline is canceled). A daemon still starting stops at once. A daemon already draining on a local request
(an earlier drain, systemctl stop, a signal) is not signalled again, since a second signal
cancels its held work: drain then only reports it (and waits, with --wait), so running
\`drain --wait\` again is safe.
Options:
  --wait               block until the daemon has exited, at most --timeout seconds
  --timeout <seconds>  how long --wait waits (default 3600, the daemon's default drain deadline)
  --cancel             escalate: cancel the held work now (the daemon's second signal), drain first
                       if it is not draining yet
Exit code 0 when the drain was asked (with --wait: the daemon exited); 1 when no daemon runs
(error type not_running) or, with --wait, it is still running at the timeout.
(The control-plane API also drains: POST /v1/runners/{id}/drain.)
${COMMON}`,
  doctor: `Usage: agentplane-runner doctor [--image <image>]

Checks, each with pass/fail and the fix: paired, control plane reachable, runner credential
accepted (failed as unknown when the control plane cannot be reached), Docker engine answers,
sandbox image present, canary container starts (with the sandbox's isolation, each part proved
from inside it) and is torn down, git available (repository
resources are cloned on this machine). Then lists the sandboxes and workspace volumes \`prune\`
would remove (never fails a check).
Exit code 0 when every check passes.
${COMMON}`,
  service: `Usage: agentplane-runner service install|uninstall|status [--name <unit>] [--user <user>]
                                [--unit-dir <dir>] [--no-start] [--no-systemctl]
                                [--slots <n>] [--tiers <list>] [--slot-memory-mib <mib>] [--heartbeat-ms <ms>]
                                [--drain-deadline-ms <ms>] [--log-level <level>]

install writes a systemd unit (<unit-dir>/<name>.service; default /etc/systemd/system/
agentplane-runner.service, so run it as root) that runs \`agentplane-runner start\` on this config
dir as --user (default: the invoking user, $SUDO_USER under sudo; it needs the Docker socket), then
enables and starts it. The unit restarts the daemon on failure (every 5 s, without limit), except
after exit code 5 (the control plane refused its credential: pair again, then systemctl start); stopping
it (systemctl stop, uninstall, shutdown) drains: SIGTERM to the daemon, which finishes held work
up to its drain deadline, then systemd kills what is left (TimeoutStopSec = deadline + 30 s).
Logs go to the journal: journalctl -u <name> -f. These variables, when set at install time, are
written into the unit: RUNNER_METRICS_ADDR, RUNNER_MAX_SLOTS, RUNNER_TIERS, RUNNER_EXIT_WHEN_DRAINED,
RUNNER_REQUIRE_DOCKER, DOCKER_SOCKET, HTTPS_PROXY, HTTP_PROXY, NO_PROXY, AGENTPLANE_SANDBOX_SCOPE, OTEL_*.
uninstall stops (drains) and disables the unit and removes the file; status shows its state.
Several runners on one machine: one config dir and one --name each.
Options:
  --name <unit>       unit name without .service (default agentplane-runner)
  --user <user>       the account the daemon runs as; it must exist on this machine (default: the
                      invoking user, $SUDO_USER under sudo)
  --unit-dir <dir>    where the unit file goes (default /etc/systemd/system)
  --no-start          write and load the unit, do not enable or start it
  --no-systemctl      only write (or remove) the file; no systemctl calls (image builds, checks)
  --slots, --tiers, --slot-memory-mib, --heartbeat-ms, --log-level
                      written into the unit's start command (see start --help)
  --drain-deadline-ms the daemon's drain deadline on stop (default 3600000), and with it the unit's
                      TimeoutStopSec
Exit code 0 on success (2 for an unknown --user). status: 0 when the service is active, 1 otherwise;
with --no-systemctl systemd is not asked: 0 when the unit file is installed ("active": null).
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
Exit code 0 when everything planned was removed, 1 when an item could not be, 4 (error type
docker_unavailable) when the Docker engine does not answer.
${COMMON}`,
};

type Flags = Record<string, string | boolean>;

/** Every option of every command (each command reads the ones it knows). */
const OPTIONS = {
  help: { type: 'boolean', short: 'h' },
  json: { type: 'boolean' },
  wait: { type: 'boolean' },
  cancel: { type: 'boolean' },
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
  'require-docker': { type: 'boolean' },
  force: { type: 'boolean' },
  tiers: { type: 'string' },
  'acp-harness': { type: 'string' },
  browser: { type: 'boolean' },
  'browser-image': { type: 'string' },
  'egress-allow-private-networks': { type: 'boolean' },
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
} as const;

type Option = keyof typeof OPTIONS;
const START_OPTIONS: readonly Option[] = [
  'image', 'heartbeat-ms', 'slots', 'slot-memory-mib', 'drain-deadline-ms', 'exit-when-drained', 'require-docker', 'tiers', 'acp-harness', 'browser',
  'browser-image', 'egress-allow-private-networks', 'reconnect-base-ms', 'reconnect-cap-ms', 'sandbox-idle-suspend-seconds', 'sandbox-idle-expire-seconds',
  'sandbox-report-seconds', 'repository-max-mib', 'sandbox-reap-interval-seconds', 'sandbox-reap-grace-seconds', 'log-level',
];
/** What each command takes besides --help, --json and --config-dir, and how many words after its name. */
const COMMAND_OPTIONS: Readonly<Record<string, { options: readonly Option[]; words: number }>> = {
  pair: { options: ['code', 'url', 'label', 'pool', 'force', 'timeout'], words: 0 },
  enroll: { options: ['api-key', 'pool', 'url', 'label', 'force', 'timeout'], words: 0 },
  start: { options: START_OPTIONS, words: 0 },
  status: { options: [], words: 0 },
  drain: { options: ['wait', 'timeout', 'cancel'], words: 0 },
  doctor: { options: ['image'], words: 0 },
  prune: { options: ['dry-run'], words: 0 },
  service: { options: ['name', 'user', 'unit-dir', 'no-start', 'no-systemctl', 'slots', 'tiers', 'slot-memory-mib', 'heartbeat-ms', 'drain-deadline-ms', 'log-level'], words: 1 },
  help: { options: [], words: 1 },
};
const COMMON_OPTIONS: readonly string[] = ['help', 'json', 'config-dir'];

/** `command` is '' when none was given; `topic` is what `help <command>` asks about. */
function parse(argv: string[]): { command: string; topic: string | undefined; flags: Flags } {
  const { values, positionals } = parseArgs({ args: argv, allowPositionals: true, strict: true, options: OPTIONS });
  const command = positionals[0] ?? '';
  const allowed = Object.hasOwn(COMMAND_OPTIONS, command) ? COMMAND_OPTIONS[command] : undefined;
  // An option another command takes is as much a mistake here as an unknown one (`drain --dry-run`
  // would drain): each command takes only its own.
  if (allowed && !values.help) {
    const foreign = Object.keys(values).find((k) => !COMMON_OPTIONS.includes(k) && !(allowed.options as readonly string[]).includes(k));
    if (foreign) throw new TypeError(`${command} does not take --${foreign}`);
    const extra = positionals.slice(1 + allowed.words);
    if (extra.length > 0) throw new TypeError(`${command} does not take '${extra[0] ?? ''}'`);
  }
  if (command === 'service') return { command: 'service', topic: undefined, flags: { ...(values as Flags), action: positionals[1] ?? '' } };
  return { command, topic: positionals[1], flags: values as Flags };
}

/** The command named in arguments that did not parse (an unknown option), for its usage. */
function commandOf(argv: string[]): string | undefined {
  try {
    const first = parseArgs({ args: argv, allowPositionals: true, strict: false, options: OPTIONS }).positionals[0];
    return first !== undefined && COMMANDS.has(first) ? first : undefined;
  } catch {
    return undefined;
  }
}

const out = (flags: Flags, human: string, data: unknown): void => {
  process.stdout.write(flags.json ? `${JSON.stringify(data)}\n` : `${human}\n`);
};

async function pairOrEnroll(command: 'pair' | 'enroll', flags: Flags): Promise<number> {
  const config = loadDaemonConfig(process.env, flags);
  const str = (name: string): string | undefined => (typeof flags[name] === 'string' ? (flags[name] as string) : undefined);
  const url = str('url');
  if (url === undefined) throw new UsageError('--url is required');
  const timeoutMs = envInt({ '--timeout': str('timeout') }, '--timeout', 30, 1, 3600) * 1000;
  const r = await redeemOrEnroll({
    command, url, configDir: config.configDir, label: str('label') ?? hostname(), code: str('code'), apiKey: str('api-key'), pool: str('pool'),
    force: flags.force === true, timeoutMs,
    // A secret that could not be stored is shown only to a person at a terminal, never into a log.
    tty: Boolean(flags.json ? process.stdout.isTTY : process.stderr.isTTY),
  });
  out(flags, r.human, r.data);
  return 0;
}

/** A signal stopped the daemon during its startup. */
class StartupAborted extends Error {}

/**
 * Said when the daemon finished starting and serves (the platform's supervisor counts its local
 * runner up from here).
 */
const readyChannel = channel('agentplane:ready');

async function start(flags: Flags): Promise<number> {
  const config = loadDaemonConfig(process.env, flags);
  const cred = loadCredential(config.configDir);
  if (!cred) throw new UsageError(`no runner credential at ${credentialPath(config.configDir)}; run \`agentplane-runner pair\` first`, false);
  // Signals are handled from before the lock is taken: during the startup (image check, reaping,
  // tier canaries, 20 s or more) one stops the daemon at once, cleanly; once it serves, one drains.
  const startup = new AbortController();
  const aborted = new Promise<never>((_, reject) => startup.signal.addEventListener('abort', () => reject(new StartupAborted()), { once: true }));
  aborted.catch(() => undefined);
  const step = <T>(p: Promise<T>): Promise<T> => Promise.race([p, aborted]);
  let serving = false;
  let agent: RunnerAgent | undefined;
  let stopSignal: string | undefined;
  let signals = 0;
  const onSignal = (sig: string): void => {
    signals += 1;
    if (!serving || !agent) {
      if (signals > 1) return;
      stopSignal = sig;
      agent?.publishStartup('starting', 'local');
      startup.abort();
      return;
    }
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
  // One daemon per config dir, taken before anything touches the sandboxes an earlier life left:
  // a second daemon would supersede this one's connection and stop its sandboxes.
  const lock = acquireDaemonLock(config.configDir);
  clearDrainRequests(config.configDir);
  const log = createLogger({ name: 'runner', level: config.logLevel }).child({ runner: cred.runner_id });
  const docker = dockerClient(config.dockerSocket);
  agent = new RunnerAgent(cred, config, log, docker);
  // `status` and `drain` see a starting daemon from here on (start said "already running" already).
  agent.publishStartup('starting', stopSignal ? 'local' : null);
  const running = agent;
  // Prometheus metrics on an optional listen address (off unless RUNNER_METRICS_ADDR is set).
  const metrics = new RunnerMetrics(() => running.heldCount, { served: Boolean(config.metricsAddr) });
  agent.metrics = metrics;
  const sandboxes = new DaemonSandboxes({ config, cred, docker, log, agent, metrics });
  const dockerCheck = new DockerCheck(docker, (ok) => metrics.dockerUp.set(ok ? 1 : 0));
  // A switch of driver means the engine was just found (or lost): an answer cached before it is stale.
  let healthDriver = sandboxes.driver;
  const health = async () => {
    if (sandboxes.driver !== healthDriver) {
      healthDriver = sandboxes.driver;
      dockerCheck.reset();
    }
    return runnerHealth({
      started: serving, connected: running.connected, driver: sandboxes.driver, dockerOk: await dockerCheck.ok(),
      draining: running.status === 'draining', tiers: running.verifiedTiers, credentialRefused: running.credentialRefusal !== null,
    });
  };
  let tracing: Awaited<ReturnType<typeof startTracing>> | undefined;
  let metricsServer: Awaited<ReturnType<typeof serveMetrics>> | undefined;
  /** The end of a daemon that never served: no process left running, the lock given up. */
  const stopBeforeServing = async (): Promise<void> => {
    sandboxes.abandon();
    metricsServer?.close();
    await tracing?.shutdown().catch(() => undefined);
    running.publishStartup('stopped');
    rmSync(drainRequestPath(config.configDir, process.pid), { force: true });
    lock.release();
  };
  try {
    if (startup.signal.aborted) throw new StartupAborted();
    tracing = await step(startTracing('agentplane-runner', log));
    metricsServer = config.metricsAddr ? await step(serveMetrics(metrics.registry, config.metricsAddr, log, health)) : undefined;
    // The sandbox: Docker when the engine answers (image built offline if missing), else the
    // unisolated process driver, Docker tried again in the background. Orphans of an earlier
    // life of this runner are reaped first.
    await sandboxes.start(step);
  } catch (err) {
    await stopBeforeServing();
    if (err instanceof StartupAborted) {
      log.info({ signal: stopSignal ?? null }, 'stopping during startup');
      return 0;
    }
    if (err instanceof DockerUnavailableError) throw new CliError('docker_unavailable', err.message, RUNNER_EXIT.dockerUnavailable);
    throw err;
  }
  serving = true;
  readyChannel.publish({ runner: cred.runner_id });
  await agent.run();
  // A clean stop leaves no process running; the workspaces of live Sessions stay (durable
  // retention) and are released when their Session ends or their idle time expires.
  const kept = await sandboxes.shutdown();
  if (sandboxes.started) log.info({ kept_workspaces: kept }, 'stopped this runner\'s sandboxes');
  metricsServer?.close();
  await tracing.shutdown();
  log.info('runner stopped');
  rmSync(drainRequestPath(config.configDir, process.pid), { force: true });
  lock.release();
  // Refused for good: restarting it as it is would only be refused again (exit code 5).
  const refusal = agent.credentialRefusal;
  if (refusal) throw credentialRefused(refusal, cred, config.configDir);
  return 0;
}

/** The daemon process runs (as any user; a zombie does not count). */
const alive = (pid: number): boolean => processLive({ pid, start: null });

/** `ready, connected (generation 3)`, `disconnected (reconnecting)`, `starting (not connected yet)`, … */
function statusLine(d: { running: boolean; status: string; connected: boolean; generation: number | null; credential_refused: CredentialRefusal | null }): string {
  const refused = d.credential_refused;
  if (refused) {
    return `${d.running ? 'stopping' : 'stopped'}: the control plane refused this runner's credential (HTTP ${refused.http_status}, at ${refused.at}); ` +
      'pair this machine again: agentplane-runner pair --force (a managed pool\'s runner: agentplane-runner enroll --force)';
  }
  if (!d.running) return d.status;
  if (d.connected) return `${d.status}, connected (generation ${d.generation})`;
  if (d.status === 'starting') return 'starting (sandbox image and isolation checks; not connected yet)';
  if (d.status === 'disconnected') return 'disconnected (reconnecting)';
  return `${d.status}, disconnected (reconnecting)`;
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
    drain: running ? (state!.drain ?? null) : null,
    credential_refused: state?.credential_refused ?? null,
  };
  const human = !cred
    ? 'not paired (run `agentplane-runner pair`)'
    : [
        `runner      ${data.runner_id}`,
        `pool        ${data.runner_pool_id}`,
        `control     ${data.base_url}`,
        `daemon      ${running ? `running (pid ${data.pid})` : 'not running'}`,
        `status      ${statusLine(data)}${data.drain ? ` (drain asked by ${data.drain === 'local' ? 'a local signal' : 'the control plane'})` : ''}`,
        `last ack    ${data.last_heartbeat_ack_at ?? '-'}`,
      ].join('\n');
  out(flags, human, data);
  return data.connected ? 0 : 1;
}

/** How long `drain --cancel` waits for the daemon to take the drain before it cancels (its second signal). */
const CANCEL_HANDSHAKE_MS = 30_000;

const pause = (deadline: number): Promise<void> => new Promise((r) => setTimeout(r, Math.min(200, Math.max(1, deadline - Date.now()))));

function signalDaemon(pid: number): void {
  try {
    process.kill(pid, 'SIGTERM');
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === 'EPERM') throw new Error(`not allowed to signal daemon ${pid}: run drain as its user (or root)`);
    throw err;
  }
}

async function drain(flags: Flags): Promise<number> {
  const config = loadDaemonConfig(process.env, flags);
  const dir = config.configDir;
  const timeoutMs = envInt({ '--timeout': typeof flags.timeout === 'string' ? flags.timeout : undefined }, '--timeout', 3600, 0) * 1000;
  const state = loadState(dir);
  if (!state || state.status === 'stopped' || !alive(state.pid)) throw new CliError('not_running', `no running daemon on ${dir}`, 1, { running: false });
  const pid = state.pid;
  // A second signal makes a draining daemon cancel its held work, so a daemon already draining on
  // a local request is not signalled again: it says so in its state file once it took the signal,
  // and the drain request file (created exclusively) covers the moment before.
  const signalled = state.drain !== 'local' && claimDrainRequest(dir, pid);
  if (signalled) signalDaemon(pid);
  let canceled = false;
  if (flags.cancel) {
    // Escalation: the second signal, sent once the daemon took the first (two sent at once may
    // arrive as one).
    const until = Date.now() + CANCEL_HANDSHAKE_MS;
    while (alive(pid) && loadState(dir)?.drain !== 'local' && Date.now() < until) await pause(until);
    if (alive(pid)) {
      if (loadState(dir)?.drain !== 'local') throw new Error(`daemon ${pid} did not take the drain within ${CANCEL_HANDSHAKE_MS / 1000} s; its held work was not canceled`);
      signalDaemon(pid);
      canceled = true;
    }
  }
  const requestedAt = drainRequestedAt(dir, pid);
  const since = requestedAt ? `drain requested at ${requestedAt}` : 'on a signal: systemctl stop, Ctrl-C or kill';
  const asked = signalled
    ? `drain requested (pid ${pid})`
    : `daemon ${pid} is already draining (${since}); not signalled again${flags.cancel ? '' : ' (`drain --cancel` cancels its held work)'}`;
  const said = canceled ? `${asked}\nasked daemon ${pid} to cancel its held work` : asked;
  const result = { pid, signalled, already_draining: !signalled, canceled };
  if (!flags.wait) {
    out(flags, said, { ok: true, ...result, exited: false });
    return 0;
  }
  const deadline = Date.now() + timeoutMs;
  while (alive(pid) && Date.now() < deadline) await pause(deadline);
  if (alive(pid)) {
    out(flags, `${said}\ndaemon ${pid} still running after ${timeoutMs / 1000} s (it is draining; \`agentplane-runner drain --wait\` waits again without signalling it, \`drain --cancel\` cancels its held work; see \`agentplane-runner status\`)`, {
      ok: false, ...result, exited: false, timed_out: true,
    });
    return 1;
  }
  out(flags, `${said}\ndaemon ${pid} drained and exited`, { ok: true, ...result, exited: true });
  return 0;
}

/** What `prune` would remove: managed sandboxes of gone runners of this machine (this runner's own excluded). */
async function plan(config: DaemonConfig): Promise<ReapPlan> {
  const cred = loadCredential(config.configDir);
  return planReap({ docker: dockerClient(config.dockerSocket), scope: config.sandboxScope, selfRunnerId: cred?.runner_id });
}

/** `prune` lists and removes through the engine: one that does not answer is said so, not taken for a file error. */
async function requireDocker(config: DaemonConfig, command: string): Promise<void> {
  if (await dockerAvailable(dockerClient(config.dockerSocket))) return;
  throw new CliError('docker_unavailable', `the Docker engine (${config.dockerSocket ?? 'Docker\'s default socket'}) does not answer: ${command} lists and removes sandboxes through it; start Docker (or fix DOCKER_SOCKET) and run it again`, RUNNER_EXIT.dockerUnavailable);
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
  await requireDocker(config, 'prune');
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

const SERVICE_ENV = /^(RUNNER_METRICS_ADDR|RUNNER_MAX_SLOTS|RUNNER_TIERS|RUNNER_EXIT_WHEN_DRAINED|RUNNER_REQUIRE_DOCKER|DOCKER_SOCKET|HTTPS?_PROXY|NO_PROXY|AGENTPLANE_SANDBOX_SCOPE|OTEL_[A-Z0-9_]+)$/;

function service(flags: Flags): number {
  const action = flags.action;
  const config = loadDaemonConfig(process.env, flags);
  const name = typeof flags.name === 'string' ? flags.name : DEFAULT_UNIT_NAME;
  if (!validUnitName(name)) throw new UsageError(`--name '${name}' is not a unit name (letters, digits, :_.@-; without .service)`);
  const ctx: ServiceContext = { unitDir: typeof flags['unit-dir'] === 'string' ? resolve(flags['unit-dir']) : DEFAULT_UNIT_DIR, systemctl: !flags['no-systemctl'] };
  let r: ServiceResult;
  if (action === 'install') {
    if (!existsSync(credentialPath(config.configDir))) throw new UsageError(`not paired: no credential in ${config.configDir} (run pair or enroll first)`, false);
    const user = typeof flags.user === 'string' ? flags.user : defaultUnitOptions(config.configDir).user;
    if (!validUserName(user)) throw new UsageError(`--user '${user}' is not a user name`);
    // systemd would only find out when the unit starts (status 217/USER, restarted every 5 s).
    const known = userExists(user);
    if (known === false) throw new ConfigError(`--user: no user '${user}' on this machine (create it first, e.g. useradd --system ${user}, and give it the Docker socket)`);
    if (known === null) throw new ConfigError(`--user: could not check that user '${user}' exists (the id command failed)`);
    const startArgs: string[] = [];
    for (const f of ['slots', 'tiers', 'slot-memory-mib', 'heartbeat-ms', 'log-level'] as const) if (typeof flags[f] === 'string') startArgs.push(`--${f}`, flags[f]);
    // Read as `start` reads it (a timer's bound included), so the unit never holds a value its daemon refuses.
    const deadline = envInt({ '--drain-deadline-ms': typeof flags['drain-deadline-ms'] === 'string' ? flags['drain-deadline-ms'] : undefined }, '--drain-deadline-ms', 3_600_000, 0);
    const environment = Object.fromEntries(Object.entries(process.env).filter((e): e is [string, string] => SERVICE_ENV.test(e[0]) && typeof e[1] === 'string'));
    r = installService(ctx, {
      ...defaultUnitOptions(config.configDir), name, drainDeadlineMs: deadline, startArgs, environment, user,
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
  ['pair', (f) => pairOrEnroll('pair', f)],
  ['enroll', (f) => pairOrEnroll('enroll', f)],
  ['start', start],
  ['status', status],
  ['drain', drain],
  ['doctor', doctor],
  ['prune', prune],
  ['service', service],
] satisfies Array<[CommandName, (flags: Flags) => Promise<number> | number]>);

function fail(json: boolean, command: string | undefined, err: unknown): number {
  const e = classify(err);
  if (json) {
    process.stdout.write(`${JSON.stringify({ ok: false, ...e.fields, error: { type: e.type, message: e.message, ...e.detail } })}\n`);
  } else {
    const usage = err instanceof UsageError && err.showUsage ? `\n\n${(command && HELP[command]) || HELP.main}` : '';
    process.stderr.write(`agentplane-runner${command ? ` ${command}` : ''}: ${e.message}${usage}\n`);
  }
  return e.code;
}

async function main(argv: string[]): Promise<number> {
  let parsed: ReturnType<typeof parse>;
  try {
    parsed = parse(argv);
  } catch (err) {
    // The flags did not parse, so --json and the command are looked for in the raw arguments.
    return fail(argv.includes('--json'), commandOf(argv), new UsageError(err instanceof Error ? err.message : String(err)));
  }
  const { command, topic, flags } = parsed;
  const json = !!flags.json;
  if (command === '' && flags.help) {
    process.stdout.write(`${HELP.main}\n`);
    return 0;
  }
  if (command === '') return fail(json, undefined, new UsageError('no command given'));
  if (command === 'help') {
    if (topic !== undefined && !COMMANDS.has(topic)) return fail(json, undefined, new UsageError(`unknown command '${topic}'`));
    process.stdout.write(`${HELP[topic ?? 'main']}\n`);
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
