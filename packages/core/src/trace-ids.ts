/**
 * Trace and span ids for the tracer provider (the SDK's `IdGenerator` extension point): cut from
 * a pool of random hex refilled from the system's CSPRNG, one call per 8 KiB of hex (about 170
 * root spans, 512 child spans), instead of the SDK's default of `Math.random` written into a buffer and hex-encoded per
 * id. W3C trace context forbids all-zero ids: such a draw is replaced.
 */
import { randomBytes } from 'node:crypto';

const POOL_BYTES = 4096;
const ZERO_TRACE = '0'.repeat(32);
const ZERO_SPAN = '0'.repeat(16);

export class PooledIdGenerator {
  private pool = '';
  private at = 0;
  private presetTrace: string | undefined;
  private presetSpan: string | undefined;

  /**
   * The next trace id and span id handed out are these: how a span recorded ahead of the SDK
   * (tracing-deferred.ts) keeps, as an SDK span, the ids its context already carried.
   */
  preset(traceId: string, spanId: string): void {
    this.presetTrace = traceId;
    this.presetSpan = spanId;
  }

  /** Forget a preset not taken (the SDK asks for no trace id when the span has a parent). */
  clearPreset(): void {
    this.presetTrace = undefined;
    this.presetSpan = undefined;
  }

  /** 32 lowercase hex digits, never all zero. */
  generateTraceId(): string {
    if (this.presetTrace !== undefined) {
      const preset = this.presetTrace;
      this.presetTrace = undefined;
      return preset;
    }
    let id = this.take(32);
    while (id === ZERO_TRACE) id = this.take(32);
    return id;
  }

  /** 16 lowercase hex digits, never all zero. */
  generateSpanId(): string {
    if (this.presetSpan !== undefined) {
      const preset = this.presetSpan;
      this.presetSpan = undefined;
      return preset;
    }
    let id = this.take(16);
    while (id === ZERO_SPAN) id = this.take(16);
    return id;
  }

  private take(n: number): string {
    if (this.at + n > this.pool.length) {
      this.pool = randomBytes(POOL_BYTES).toString('hex');
      this.at = 0;
    }
    const id = this.pool.slice(this.at, this.at + n);
    this.at += n;
    return id;
  }
}
