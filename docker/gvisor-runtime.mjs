#!/usr/bin/env node
// Registers gVisor's runsc as a Docker runtime named `runsc` (network off inside gVisor too) in
// /etc/docker/daemon.json, keeping every other setting, then asks a running dockerd to reload
// its configuration (SIGHUP: runtimes reload without a restart). Runners then verify the
// `gvisor` tier with a canary sandbox and offer it. Usage: node docker/gvisor-runtime.mjs [--help]
import { execFileSync } from 'node:child_process';
import { existsSync, mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { dirname } from 'node:path';

const FILE = process.env.DOCKER_DAEMON_JSON ?? '/etc/docker/daemon.json';
if (process.argv.includes('--help') || process.argv.includes('-h')) {
  process.stdout.write(`Usage: node docker/gvisor-runtime.mjs

Adds {"runtimes": {"runsc": {"path": <runsc>, "runtimeArgs": ["--network=none"]}}} to
${FILE} (DOCKER_DAEMON_JSON overrides the path) and sends SIGHUP to a running dockerd.
Needs runsc on PATH (Debian: apt-get install runsc) and write access to the file.
`);
  process.exit(0);
}
// It changes the machine's Docker configuration: nothing else on its command line is taken as nothing.
const extra = process.argv.slice(2);
if (extra.length > 0) {
  process.stderr.write(`unknown argument '${extra[0]}': this script takes only --help (see --help)\n`);
  process.exit(2);
}
let runsc;
try {
  runsc = execFileSync('sh', ['-c', 'command -v runsc'], { encoding: 'utf8' }).trim();
} catch {
  process.stderr.write('runsc is not on PATH (Debian: apt-get install runsc)\n');
  process.exit(1);
}
let config = {};
if (existsSync(FILE)) {
  try {
    config = JSON.parse(readFileSync(FILE, 'utf8') || '{}');
  } catch (err) {
    process.stderr.write(`${FILE} is not JSON (${err.message}): fix it first; nothing was changed\n`);
    process.exit(1);
  }
  if (typeof config !== 'object' || config === null || Array.isArray(config)) {
    process.stderr.write(`${FILE} does not hold a JSON object: fix it first; nothing was changed\n`);
    process.exit(1);
  }
}
const want = { path: runsc, runtimeArgs: ['--network=none'] };
if (JSON.stringify(config.runtimes?.runsc) === JSON.stringify(want)) {
  process.stdout.write(`${FILE}: runsc runtime already registered\n`);
} else {
  config.runtimes = { ...(config.runtimes ?? {}), runsc: want };
  mkdirSync(dirname(FILE), { recursive: true });
  writeFileSync(FILE, `${JSON.stringify(config, null, 2)}\n`);
  process.stdout.write(`${FILE}: runsc runtime registered (${runsc})\n`);
}
let pid = '';
try {
  pid = execFileSync('pgrep', ['-xo', 'dockerd'], { encoding: 'utf8' }).trim();
} catch {
  /* not running: it reads the file when it starts */
}
if (pid) {
  process.kill(Number(pid), 'SIGHUP');
  process.stdout.write(`dockerd (pid ${pid}) asked to reload its configuration\n`);
}
