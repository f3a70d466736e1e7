import { closeSync, openSync } from 'node:fs';

/**
 * Named points where a crash test can kill this process, so the windows between two writes
 * that recovery must repair are hit deterministically instead of by timing.
 *
 * `AGENTPLANE_CRASH_AT=<point>:<marker file>` makes the process SIGKILL itself the first time
 * it reaches `<point>`: it creates the marker file exclusively first, so a restarted process
 * (which inherits the same environment) passes the point. Unset, a crash point is one property
 * read. Operators never set it; docs/OPERATIONS.md lists it among the test-only settings.
 */
const spec = parse(process.env.AGENTPLANE_CRASH_AT);

function parse(raw: string | undefined): { point: string; marker: string } | null {
  if (!raw) return null;
  const at = raw.indexOf(':');
  if (at <= 0 || at === raw.length - 1) return null;
  return { point: raw.slice(0, at), marker: raw.slice(at + 1) };
}

export function crashPoint(point: string): void {
  if (spec === null || spec.point !== point) return;
  try {
    closeSync(openSync(spec.marker, 'wx'));
  } catch {
    return; // already crashed here once
  }
  process.kill(process.pid, 'SIGKILL');
}
