import { spawn, type ChildProcess, type SpawnOptions } from 'node:child_process';
import { parentDeathWrapper } from '@agentplane/store';

/** Asked once per test process (it runs `setpriv --help`). */
const wrapper = parentDeathWrapper();

/**
 * `spawn(command, args, options)` under the parent-death wrapper the platform uses for its own
 * children: the child gets SIGTERM when the test process that started it dies without stopping
 * it (a test worker killed at its timeout, a bench whose output pipe closed), so no platform,
 * runner daemon, gateway, api node or Redis outlives the run that started it. The wrapper execs
 * the command, so the child's pid is the command's own: a test's `kill -9` reaches it.
 */
export function spawnOwned(command: string, args: readonly string[], options: SpawnOptions): ChildProcess {
  const [cmd = command, ...pre] = [...wrapper, command];
  return spawn(cmd, [...pre, ...args], options);
}
