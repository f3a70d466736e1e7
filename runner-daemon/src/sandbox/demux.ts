/**
 * Docker's multiplexed exec stream (8-byte headers: stream kind, then payload length) split into
 * stdout and stderr with backpressure. dockerode's own demultiplexer writes on whatever the reader
 * does, so a command whose output outruns its reader piles up in the runner's memory; this one
 * pauses the exec stream while either side cannot take more, which holds the command back
 * through the engine (its writes block in the sandbox, as on a pipe).
 */
import type { Readable } from 'node:stream';

export interface HeldDemux {
  /**
   * Stops holding the command back: from now on a side nobody reads is dropped and the rest is
   * passed on as it comes. For a command being killed, whose end must be read even when its
   * reader has stopped reading (a paused stream would not see it).
   */
  release(): void;
}

/** A side nobody is reading: a stream that is readable and not flowing (paused, or never read). */
function unread(target: NodeJS.WritableStream): boolean {
  const flowing = (target as { readableFlowing?: Readable['readableFlowing'] }).readableFlowing;
  return flowing !== undefined && flowing !== true;
}

/**
 * Splits `stream` into `stdout` and `stderr`, pausing it while either cannot take more. The
 * reader must read both sides (or `resume()` one it does not want): a side left unread holds
 * the command.
 */
export function demuxHeld(stream: NodeJS.ReadableStream, stdout: NodeJS.WritableStream, stderr: NodeJS.WritableStream): HeldDemux {
  let buffered: Buffer = Buffer.alloc(0);
  let waiting = 0;
  let released = false;
  const hold = (target: NodeJS.WritableStream): void => {
    waiting += 1;
    stream.pause();
    target.once('drain', () => {
      waiting -= 1;
      if (waiting === 0 && !released) stream.resume();
    });
  };
  stream.on('data', (chunk: Buffer) => {
    buffered = buffered.length ? Buffer.concat([buffered, chunk]) : chunk;
    while (buffered.length >= 8) {
      const length = buffered.readUInt32BE(4);
      if (buffered.length < 8 + length) break;
      const target = buffered[0] === 2 ? stderr : stdout;
      const payload = buffered.subarray(8, 8 + length);
      buffered = buffered.subarray(8 + length);
      if (released) {
        if (!unread(target)) target.write(payload);
      } else if (!target.write(payload)) hold(target);
    }
  });
  return {
    release: () => {
      if (released) return;
      released = true;
      stream.resume();
    },
  };
}
