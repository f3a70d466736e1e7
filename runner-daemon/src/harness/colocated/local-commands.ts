/**
 * The colocated harness's "driver": the built-in tools' commands run as child processes of the
 * harness, inside the sandbox, under the same contract as a driver's `exec` (output caps,
 * timeouts, process-group kills on timeout or interrupt, OOM reported). Each command first
 * raises its own OOM score, so under memory pressure the kernel kills the agent's commands
 * before the harness that must report them.
 */
import { readFileSync } from 'node:fs';
import { execChild } from '../../sandbox/child-exec.js';
import type { Command, CommandRunner, ExecOptions, ExecResult, Sandbox } from '../../sandbox/types.js';

const OOM_FIRST = ['bash', '-c', 'echo 1000 > /proc/self/oom_score_adj 2>/dev/null; exec "$@"', 'agentplane-tool'];

/** The cgroup's OOM-kill counter (v2 `memory.events`, v1 `memory.oom_control`); 0 when unreadable. */
function oomKills(): number {
  for (const file of ['/sys/fs/cgroup/memory.events', '/sys/fs/cgroup/memory/memory.oom_control']) {
    try {
      const match = /oom_kill\s+(\d+)/.exec(readFileSync(file, 'utf8'));
      if (match?.[1]) return Number(match[1]);
    } catch {
      // not this cgroup version
    }
  }
  return 0;
}

export class LocalCommands implements CommandRunner {
  private oomSeen = oomKills();

  constructor(
    private readonly env: NodeJS.ProcessEnv = process.env,
    private readonly oomFirst: boolean = true,
  ) {}

  async exec(sandbox: Sandbox, command: Command, options: ExecOptions = {}): Promise<ExecResult> {
    const argv = Array.isArray(command) ? command : ['bash', '-c', command.script];
    const cwd = options.cwd ? (options.cwd.startsWith('/') ? options.cwd : `${sandbox.workspace}/${options.cwd}`) : sandbox.workspace;
    const res = await execChild(this.oomFirst ? [...OOM_FIRST, ...argv] : argv, { cwd, env: { ...this.env, ...options.env } }, options);
    if (res.exitCode === 137 && !res.timedOut && !res.killed) {
      const count = oomKills();
      res.oomKilled = count > this.oomSeen;
      this.oomSeen = Math.max(count, this.oomSeen);
    }
    return res;
  }
}
