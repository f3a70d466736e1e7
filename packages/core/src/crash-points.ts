import { closeSync, openSync } from 'node:fs';

/**
 * Named points where a crash test can kill this process, so the windows between two writes
 * that recovery must repair are hit deterministically instead of by timing.
 *
 * `AGENTPLANE_CRASH_AT=<point>:<marker file>` makes the process SIGKILL itself the first time
 * it reaches `<point>`: it creates the marker file exclusively first, so a restarted process
 * (which inherits the same environment) passes the point. Several points, each with its own
 * marker, are separated by commas (a recovery that crashes in turn). Unset, a crash point is
 * one property read. Operators never set it; docs/OPERATIONS.md lists it among the test-only
 * settings.
 */
const specs = parse(process.env.AGENTPLANE_CRASH_AT);

function parse(raw: string | undefined): Map<string, string> | null {
  if (!raw) return null;
  const out = new Map<string, string>();
  for (const one of raw.split(',')) {
    const at = one.indexOf(':');
    if (at > 0 && at < one.length - 1) out.set(one.slice(0, at), one.slice(at + 1));
  }
  return out.size > 0 ? out : null;
}

export function crashPoint(point: string): void {
  const marker = specs?.get(point);
  if (marker === undefined) return;
  try {
    closeSync(openSync(marker, 'wx'));
  } catch {
    return; // already crashed here once
  }
  process.kill(process.pid, 'SIGKILL');
}
