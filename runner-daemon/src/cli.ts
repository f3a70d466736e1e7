#!/usr/bin/env node
import { join } from 'node:path';
import { parseArgs } from 'node:util';
import { hostname } from 'node:os';
import { createLogger } from '@agentplane/core';
import { RunnerAgent } from './agent.js';
import { dockerClient } from './capabilities.js';
import { credentialPath, loadCredential, loadDaemonConfig, loadState, saveCredential, type RunnerCredentialFile } from './config.js';
import { runDoctor } from './doctor.js';
import { firstWilling, noopExecutor, turnExecutor } from './executors/index.js';
import { SandboxManager } from './sandbox/manager.js';
import { ensureSandboxImageIfDocker, selectDriver } from './sandbox/index.js';

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
  doctor   preflight: control plane, credential, Docker, sandbox image, canary container
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
drain deadline (default 1 h), cancels held work.
Options:
  --heartbeat-ms <ms>        override the gateway's heartbeat interval
  --slots <n>                cap on concurrent work (default: CPU count, bounded by free memory)
  --slot-memory-mib <mib>    memory reserved per slot (default 512)
  --drain-deadline-ms <ms>   drain deadline on SIGTERM (default 3600000)
  --reconnect-base-ms, --reconnect-cap-ms   backoff bounds (default 1000, 64000)
  --sandbox-idle-suspend-seconds <s>   stop an idle Session sandbox's processes (default 600; 0 never)
  --sandbox-idle-expire-seconds <s>    remove an idle Session sandbox and its workspace (default 86400; 0 never)
  --sandbox-report-seconds <s>         how often sandboxes of archived/deleted Sessions are released (default 30)
  --repository-max-mib <mib>           largest repository snapshot fetched for a Session (default 256)
  --log-level <level>        pino level (default info)
Environment: AGENTPLANE_RUNNER_HOME, RUNNER_MAX_SLOTS, SANDBOX_IDLE_SUSPEND_SECONDS,
SANDBOX_IDLE_EXPIRE_SECONDS, SANDBOX_REPORT_SECONDS, REPOSITORY_MAX_MIB, DOCKER_SOCKET, LOG_LEVEL.
Repository resources are fetched on this machine with git (the sandbox has no network), with
this machine's git credentials (HTTPS credential helpers, SSH keys for git@ URLs).
${COMMON}`,
  status: `Usage: agentplane-runner status

Prints the running daemon's status (pid, connected, generation, last heartbeat).
Exit code 0 when connected, 1 otherwise.
${COMMON}`,
  drain: `Usage: agentplane-runner drain [--wait]

Sends SIGTERM to the running daemon: it stops taking work, finishes held work and exits.
--wait blocks until it has exited. (The control-plane API also drains: POST /v1/runners/{id}/drain.)
${COMMON}`,
  doctor: `Usage: agentplane-runner doctor [--image <image>]

Checks, each with pass/fail and the fix: paired, control plane reachable, runner credential
accepted, Docker engine answers, sandbox image present, canary container starts and is torn down,
git available (repository resources are cloned on this machine).
Exit code 0 when every check passes.
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
      'reconnect-base-ms': { type: 'string' },
      'reconnect-cap-ms': { type: 'string' },
      'sandbox-idle-suspend-seconds': { type: 'string' },
      'sandbox-idle-expire-seconds': { type: 'string' },
      'sandbox-report-seconds': { type: 'string' },
      'repository-max-mib': { type: 'string' },
      'log-level': { type: 'string' },
    },
  });
  return { command: positionals[0] ?? 'help', flags: values as Flags };
}

const out = (flags: Flags, human: string, data: unknown): void => {
  process.stdout.write(flags.json ? `${JSON.stringify(data)}\n` : `${human}\n`);
};

async function redeemOrEnroll(command: 'pair' | 'enroll', flags: Flags): Promise<number> {
  const config = loadDaemonConfig(process.env, flags);
  const url = flags.url;
  if (typeof url !== 'string') throw new UsageError(`${command}: --url is required`);
  const label = typeof flags.label === 'string' ? flags.label : hostname();
  let res: Response;
  if (command === 'pair') {
    if (typeof flags.code !== 'string') throw new UsageError('pair: --code is required');
    res = await fetch(new URL('/v1/runner-pairings/redeem', url), {
      method: 'POST',
      headers: { 'content-type': 'application/json', 'service-version': '2026-08-27' },
      body: JSON.stringify({
        code: flags.code,
        runner_enrollment: { placement: 'byoc', display_name: label, ...(typeof flags.pool === 'string' ? { runner_pool_id: flags.pool } : {}) },
      }),
    });
  } else {
    if (typeof flags['api-key'] !== 'string' || typeof flags.pool !== 'string') throw new UsageError('enroll: --api-key and --pool are required');
    res = await fetch(new URL(`/v1/runner-pools/${flags.pool}/enrollments`, url), {
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

async function start(flags: Flags): Promise<number> {
  const config = loadDaemonConfig(process.env, flags);
  const cred = loadCredential(config.configDir);
  if (!cred) {
    process.stderr.write(`no runner credential at ${credentialPath(config.configDir)}; run \`agentplane-runner pair\` first\n`);
    return 2;
  }
  const log = createLogger({ name: 'runner', level: config.logLevel }).child({ runner: cred.runner_id });
  const docker = dockerClient(config.dockerSocket);
  const agent = new RunnerAgent(cred, config, log, docker);
  // The sandbox: Docker when the engine answers (image built offline if missing), else the
  // unisolated process driver. Orphans of an earlier life of this runner are reaped first.
  const image = await ensureSandboxImageIfDocker({ docker, onProgress: (line: string) => log.info(line) }).catch((err: unknown) => {
    log.warn({ err: err instanceof Error ? err.message : String(err) }, 'sandbox image could not be built');
    return undefined;
  });
  const driver = await selectDriver({ runnerId: cred.runner_id, dataDir: join(config.configDir, 'sandboxes'), docker, logger: log });
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
    agent.executor = firstWilling(turnExecutor({ sandboxes, log, baseUrl: cred.base_url, repositoryMaxBytes: config.repositoryMaxBytes }), noopExecutor);
    log.info({ driver: driver.name, tier: driver.tier, image: image?.latest }, 'sandbox driver ready');
  } else {
    agent.executor = noopExecutor;
  }
  let signals = 0;
  const onSignal = (sig: string) => {
    signals += 1;
    if (signals === 1) {
      log.info({ signal: sig }, 'drain requested by signal; finishing held work (send again to cancel it)');
      agent.beginDrain(Date.now() + config.drainDeadlineMs, `${sig} received`);
    } else {
      log.warn({ signal: sig }, 'second signal: canceling held work');
      agent.cancelAll(`${sig} received twice`);
    }
  };
  process.on('SIGTERM', () => onSignal('SIGTERM'));
  process.on('SIGINT', () => onSignal('SIGINT'));
  await agent.run();
  // A clean stop leaves no process running; the workspaces of live Sessions stay (durable
  // retention) and are released when their Session ends or their idle time expires.
  if (sandboxes) {
    await sandboxes.shutdown();
    log.info({ kept_workspaces: sandboxes.sessions().length }, 'stopped this runner\'s sandboxes');
  }
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
  const state = loadState(config.configDir);
  if (!state || state.status === 'stopped' || !alive(state.pid)) {
    out(flags, 'no running daemon', { ok: false, running: false });
    return 1;
  }
  process.kill(state.pid, 'SIGTERM');
  if (flags.wait) while (alive(state.pid)) await new Promise((r) => setTimeout(r, 200));
  out(flags, flags.wait ? `daemon ${state.pid} drained and exited` : `drain requested (pid ${state.pid})`, { ok: true, pid: state.pid, exited: !!flags.wait });
  return 0;
}

async function doctor(flags: Flags): Promise<number> {
  const config = loadDaemonConfig(process.env, flags);
  const checks = await runDoctor(config, loadCredential(config.configDir), dockerClient(config.dockerSocket));
  const ok = checks.every((c) => c.ok);
  const human = checks.map((c) => `${c.ok ? 'PASS' : 'FAIL'}  ${c.name}: ${c.detail}${!c.ok && c.fix ? `\n      fix: ${c.fix}` : ''}`).join('\n');
  out(flags, `${human}\n${ok ? 'all checks passed' : 'some checks failed'}`, { ok, checks });
  return ok ? 0 : 1;
}

class UsageError extends Error {}

async function main(): Promise<number> {
  let parsed: { command: string; flags: Flags };
  try {
    parsed = parse(process.argv.slice(2));
  } catch (err) {
    process.stderr.write(`${err instanceof Error ? err.message : String(err)}\n\n${HELP.main}\n`);
    return 2;
  }
  const { command, flags } = parsed;
  if (command === 'help' || !(command in HELP)) {
    process.stdout.write(`${HELP.main}\n`);
    return command === 'help' ? 0 : 2;
  }
  if (flags.help) {
    process.stdout.write(`${HELP[command]}\n`);
    return 0;
  }
  try {
    switch (command) {
      case 'pair':
      case 'enroll':
        return await redeemOrEnroll(command, flags);
      case 'start':
        return await start(flags);
      case 'status':
        return status(flags);
      case 'drain':
        return await drain(flags);
      case 'doctor':
        return await doctor(flags);
      default:
        return 2;
    }
  } catch (err) {
    if (err instanceof UsageError) {
      process.stderr.write(`${err.message}\n\n${HELP[command]}\n`);
      return 2;
    }
    throw err;
  }
}

main().then(
  (code) => process.exit(code),
  (err: unknown) => {
    process.stderr.write(`agentplane-runner: ${err instanceof Error ? err.message : String(err)}\n`);
    process.exit(1);
  },
);
