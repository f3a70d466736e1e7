import { Writable } from 'node:stream';

/**
 * Keeps the first `limit` bytes written to it and counts the rest. Emits `runaway` once when
 * what it was given passes `runawayBytes` (if set): a command still writing that much is not
 * producing output anyone reads.
 */
export class CappedBuffer extends Writable {
  private readonly chunks: Buffer[] = [];
  private kept = 0;
  truncated = false;
  total = 0;
  private ranAway = false;

  constructor(private readonly limit: number, private readonly runawayBytes = Number.POSITIVE_INFINITY) {
    super();
  }

  override _write(chunk: Buffer, _enc: BufferEncoding, callback: (error?: Error | null) => void): void {
    this.add(chunk);
    callback();
  }

  add(chunk: Buffer): boolean {
    this.total += chunk.length;
    if (!this.ranAway && this.total > this.runawayBytes) {
      this.ranAway = true;
      this.emit('runaway');
    }
    const room = this.limit - this.kept;
    if (room <= 0) {
      if (chunk.length > 0) this.truncated = true;
      return true;
    }
    if (chunk.length > room) {
      this.chunks.push(chunk.subarray(0, room));
      this.kept += room;
      this.truncated = true;
    } else {
      this.chunks.push(chunk);
      this.kept += chunk.length;
    }
    return true;
  }

  text(): string {
    return Buffer.concat(this.chunks).toString('utf8');
  }
}

/** Combines abort signals (any aborts → aborted); the reason of the first one wins. */
export function anySignal(signals: Array<AbortSignal | undefined>): AbortSignal {
  const present = signals.filter((s): s is AbortSignal => s !== undefined);
  return AbortSignal.any(present);
}

export function sleep(ms: number): Promise<void> {
  return new Promise((resolve) => {
    setTimeout(resolve, ms);
  });
}

/** Resolves with the promise's value, or rejects with `onTimeout()` after `ms`. */
export async function withTimeout<T>(promise: Promise<T>, ms: number, onTimeout: () => Error): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  try {
    return await Promise.race([
      promise,
      new Promise<never>((_, reject) => {
        timer = setTimeout(() => reject(onTimeout()), ms);
      }),
    ]);
  } finally {
    if (timer) clearTimeout(timer);
  }
}

/**
 * How much a command may write to one stream before it is taken for a runaway and ended: far
 * more than a chatty build prints, reached by an unbounded writer within a second.
 */
export function runawayBytes(maxOutput: number): number {
  return Math.max(64 * maxOutput, 64 * 1024 * 1024);
}

/** The note at the end of a runaway command's stderr. */
export function runawayNote(maxOutput: number): string {
  return `… [output truncated at ${maxOutput} bytes; the command was ended after writing more than ${runawayBytes(maxOutput)} bytes to one stream]`;
}

/** Text with a note on a line of its own at the end. */
export function withNote(text: string, note: string): string {
  return `${text}${text && !text.endsWith('\n') ? '\n' : ''}${note}\n`;
}

/**
 * The last `limit` bytes of an output (an ACP terminal's: truncation drops the beginning; a
 * harness's stderr, for failure reasons), cut at a character boundary. Chunks are kept as they
 * came and only the dropped head is cut off, so a long output costs time linear in its length;
 * they are joined only when read.
 */
export class OutputTail {
  private chunks: Buffer[] = [];
  /** Index of the first kept chunk (dropped ones before it are released on compaction). */
  private head = 0;
  private size = 0;
  truncated = false;

  constructor(readonly limit: number) {}

  add(chunk: Buffer): void {
    if (chunk.length === 0) return;
    this.chunks.push(chunk);
    this.size += chunk.length;
    if (this.size <= this.limit) return;
    this.truncated = true;
    this.drop(this.size - this.limit);
    // A UTF-8 continuation byte is no character's start: drop it too.
    while (this.size > 0 && ((this.chunks[this.head]?.[0] ?? 0) & 0xc0) === 0x80) this.drop(1);
  }

  text(): string {
    return Buffer.concat(this.chunks.slice(this.head)).toString('utf8');
  }

  private drop(bytes: number): void {
    let left = bytes;
    while (left > 0) {
      const first = this.chunks[this.head];
      if (!first) break;
      if (first.length <= left) {
        this.head += 1;
        this.size -= first.length;
        left -= first.length;
      } else {
        this.chunks[this.head] = first.subarray(left);
        this.size -= left;
        left = 0;
      }
    }
    if (this.head > 64 && this.head * 2 > this.chunks.length) {
      this.chunks = this.chunks.slice(this.head);
      this.head = 0;
    }
  }
}
