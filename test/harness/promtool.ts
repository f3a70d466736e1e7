import { spawnSync } from 'node:child_process';

/** Whether `promtool` (Debian package `prometheus`) is on PATH. */
export const promtoolPresent = spawnSync('promtool', ['--version'], { encoding: 'utf8' }).status === 0;

/**
 * CI installs promtool (.ci/run sets REQUIRE_PROMTOOL=1): there a missing promtool fails the
 * checks instead of skipping them.
 */
export const promtoolRequired = process.env.REQUIRE_PROMTOOL === '1';

export function promtool(args: string[], input?: string): { status: number | null; output: string } {
  const r = spawnSync('promtool', args, { encoding: 'utf8', ...(input !== undefined ? { input } : {}) });
  return { status: r.status, output: `${r.stdout ?? ''}${r.stderr ?? ''}` };
}
