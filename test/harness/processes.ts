import { rmSync } from 'node:fs';

/** Whether a process of that id exists (any state but reaped). */
export const alive = (pid: number): boolean => {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
};

/**
 * What a test file that starts platforms by hand leaves behind: processes to kill and data
 * directories to remove, once its tests are done (`cleanUp` in its `afterAll`).
 */
export class Leftovers {
  readonly dirs: string[] = [];
  readonly pids: number[] = [];

  cleanUp(): void {
    for (const pid of this.pids) {
      try {
        process.kill(pid, 'SIGKILL');
      } catch {
        /* gone */
      }
    }
    for (const d of this.dirs) rmSync(d, { recursive: true, force: true });
  }
}
