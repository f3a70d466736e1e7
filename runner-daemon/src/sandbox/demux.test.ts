import { PassThrough, Writable } from 'node:stream';
import { describe, expect, it } from 'vitest';
import { demuxHeld } from './demux.js';

/** One frame of Docker's multiplexed exec stream: 1 stdout, 2 stderr. */
const frame = (kind: number, data: Buffer): Buffer => {
  const h = Buffer.alloc(8);
  h[0] = kind;
  h.writeUInt32BE(data.length, 4);
  return Buffer.concat([h, data]);
};
const tick = (): Promise<void> => new Promise<void>((resolve) => setImmediate(resolve));

describe('demuxHeld', () => {
  it('pauses the exec stream while a reader lags, and loses nothing', async () => {
    const source = new PassThrough();
    const chunks: Buffer[] = [];
    let pending: (() => void) | undefined;
    // A stdout that takes one chunk at a time, on demand.
    const slowOut = new Writable({
      highWaterMark: 1024,
      write(chunk: Buffer, _enc, done) {
        chunks.push(chunk);
        pending = done;
      },
    });
    const errOut = new PassThrough();
    demuxHeld(source, slowOut, errOut);
    source.write(Buffer.concat([frame(1, Buffer.alloc(4096, 'a')), frame(2, Buffer.from('err')), frame(1, Buffer.alloc(4096, 'b'))]));
    await new Promise<void>((resolve) => setImmediate(resolve));
    expect(source.isPaused()).toBe(true);
    while (pending) {
      const done = pending;
      pending = undefined;
      done();
      await new Promise<void>((resolve) => setImmediate(resolve));
    }
    expect(source.isPaused()).toBe(false);
    expect(Buffer.concat(chunks).toString()).toBe('a'.repeat(4096) + 'b'.repeat(4096));
    expect(errOut.read()?.toString()).toBe('err');
  });

  it('once released, drops what nobody reads and passes on the rest, so the stream reaches its end', async () => {
    const source = new PassThrough();
    const stdout = new PassThrough();
    const stderr = new PassThrough();
    const seen: string[] = [];
    stderr.on('data', (d: Buffer) => seen.push(d.toString()));
    const demux = demuxHeld(source, stdout, stderr);
    // stdout is never read: 64 KiB of it holds the stream.
    source.write(frame(1, Buffer.alloc(64 * 1024, 'x')));
    await tick();
    expect(source.isPaused()).toBe(true);
    let ended = false;
    source.on('end', () => (ended = true));
    source.write(Buffer.concat([frame(1, Buffer.alloc(64 * 1024, 'y')), frame(2, Buffer.from('last words'))]));
    source.end();
    await tick();
    expect(ended).toBe(false);
    demux.release();
    await new Promise<void>((resolve) => (ended ? resolve() : source.once('end', () => resolve())));
    expect(seen.join('')).toBe('last words');
    // What stdout held before the release stays; what came after it, unread, was dropped.
    expect(stdout.readableLength).toBe(64 * 1024);
  });
});
