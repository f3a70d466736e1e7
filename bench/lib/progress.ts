/** Where progress goes: a terminal is redrawn in place; anything else gets one line per phase. */
export interface ProgressOutput {
  isTTY?: boolean;
  write(chunk: string): unknown;
}

export interface Progress {
  /** `done` of the phase's `total` steps are finished. */
  tick(done: number): void;
  /** The phase is over. */
  end(): void;
}

/**
 * Progress of one bench phase. On a terminal, `phase done/total` redrawn in place (`\r`);
 * otherwise (a pipe, a file, CI) nothing per step and one line when the phase ends, so a log
 * never fills with `cold 1/50cold 2/50…`.
 */
export function progress(phase: string, total: number, out: ProgressOutput = process.stdout): Progress {
  const tty = out.isTTY === true;
  let last = 0;
  return {
    tick(done) {
      last = done;
      if (tty) out.write(`\r${phase} ${done}/${total}`);
    },
    end() {
      out.write(tty ? '\n' : `${phase} ${last}/${total}\n`);
    },
  };
}
