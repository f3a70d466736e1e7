import { statfs } from 'node:fs/promises';
import type { Logger } from '@agentplane/core';
import { diskFreeMib } from '../capabilities.js';

/** How often a running command's host disk is looked at. */
export const DISK_CHECK_MS = 1_000;

/**
 * The free space a runner keeps on the file system its sandboxes write to, by default: a
 * twentieth of it, at least 256 MiB and at most 2 GiB.
 */
export function defaultReserveMib(totalMib: number): number {
  return Math.min(2048, Math.max(256, Math.floor(totalMib / 20)));
}

/** What a disk under its reserve looked like when a command was ended for it. */
export interface DiskLow {
  freeMib: number;
  reserveMib: number;
}

/** The note at the end of the stderr of a command ended because the host disk ran low. */
export function diskLowNote(low: DiskLow): string {
  return `… [the command was ended: the runner's disk has ${low.freeMib} MiB free, under the ${low.reserveMib} MiB it keeps free; remove files from the workspace to go on]`;
}

/**
 * The free space of the host file system a Docker engine writes the sandboxes' volumes and layers
 * to (its data root), checked while a command runs: a workspace volume is not capped in size (the
 * local volume driver has no quotas), so a command that writes without bound would fill the disk
 * Redis and the engine write to. Where the data root cannot be read on this machine (a remote
 * engine), nothing is watched (logged once).
 */
export class DiskGuard {
  private state: Promise<{ path: string; reserveMib: number } | null> | undefined;
  /** The last reading, shared by every command running meanwhile (one statfs a period, not one per command). */
  private reading: { at: number; low: Promise<DiskLow | null> } | undefined;

  constructor(
    private readonly locate: () => Promise<string | undefined>,
    private readonly log: Logger,
    /** MiB kept free; 0 turns the guard off. Default: `defaultReserveMib` of the file system's size. */
    private readonly reserveMib?: number,
  ) {}

  private resolve(): Promise<{ path: string; reserveMib: number } | null> {
    this.state ??= (async () => {
      if (this.reserveMib === 0) return null;
      const path = await this.locate().catch(() => undefined);
      const st = path ? await statfs(path).catch(() => undefined) : undefined;
      if (!path || !st) {
        this.log.warn({ path: path ?? null }, 'the sandboxes\' disk cannot be read here: commands are not ended when it runs low');
        return null;
      }
      const totalMib = Math.floor((st.blocks * st.bsize) / 1048576);
      return { path, reserveMib: this.reserveMib ?? defaultReserveMib(totalMib) };
    })();
    return this.state;
  }

  /** The disk's free space when it is under the reserve; null when above it or not watched. */
  low(): Promise<DiskLow | null> {
    const now = Date.now();
    if (this.reading && now - this.reading.at < DISK_CHECK_MS / 2) return this.reading.low;
    const low = (async () => {
      const s = await this.resolve();
      const freeMib = s ? await diskFreeMib(s.path) : null;
      return s && freeMib !== null && freeMib < s.reserveMib ? { freeMib, reserveMib: s.reserveMib } : null;
    })();
    this.reading = { at: now, low };
    return low;
  }
}
