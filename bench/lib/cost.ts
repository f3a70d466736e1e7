/**
 * What one request costs a server process: its CPU time (user + system, read from /proc, so it
 * counts whatever the process did, not wall-clock time that other work on the machine disturbs)
 * and the Redis commands sent meanwhile (counted with MONITOR; commands a script runs inside
 * Redis are not round trips and are left out; every client is counted, so background work such
 * as heartbeats shows up as a small share).
 */
import { readFileSync } from 'node:fs';
import { singleRedis } from '@agentplane/store';

const TICKS_PER_SECOND = 100; // USER_HZ on Linux

/** The process's CPU time so far (user + system), in microseconds; NaN off Linux. */
export function cpuMicros(pid: number): number {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
    // Fields after the command name (which may hold spaces) start after the last ')'.
    const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
    return ((Number(fields[11]) + Number(fields[12])) * 1e6) / TICKS_PER_SECOND;
  } catch {
    return Number.NaN;
  }
}

export interface Cost {
  /** CPU µs of the process per request. */
  cpuMicros: number;
  /** Redis commands sent per request (every client but scripts' own calls). */
  commands: number;
  /** The commands per request, by name, largest first. */
  byCommand: [string, number][];
}

/**
 * Starts counting the CPU of `pid` and the commands Redis at `redisUrl` receives;
 * `end(requests)` stops and returns the cost per request since.
 */
export async function costMeter(pid: number, redisUrl: string): Promise<{ end(requests: number): Promise<Cost> }> {
  const client = singleRedis(redisUrl, { lazyConnect: true });
  await client.connect();
  const monitor = await client.monitor();
  const counts = new Map<string, number>();
  monitor.on('monitor', (_time: string, args: string[], source: string) => {
    if (source === 'lua') return;
    const name = String(args[0] ?? '').toLowerCase();
    counts.set(name, (counts.get(name) ?? 0) + 1);
  });
  const cpu0 = cpuMicros(pid);
  return {
    async end(requests: number): Promise<Cost> {
      const cpu = cpuMicros(pid) - cpu0;
      monitor.disconnect();
      client.disconnect();
      const byCommand: [string, number][] = [...counts].map(([name, n]) => [name, n / requests]);
      byCommand.sort((a, b) => b[1] - a[1]);
      const total = [...counts.values()].reduce((a, b) => a + b, 0);
      return { cpuMicros: cpu / requests, commands: total / requests, byCommand };
    },
  };
}

export function formatCost(label: string, c: Cost): string {
  const top = c.byCommand.filter(([, n]) => n >= 0.05).map(([name, n]) => `${name} ${n.toFixed(2)}`).join(', ');
  return `${label}: ${c.cpuMicros.toFixed(0)} µs of API CPU and ${c.commands.toFixed(2)} Redis commands per request${top ? ` (${top})` : ''}`;
}
