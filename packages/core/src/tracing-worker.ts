/**
 * The exporter thread of a process with tracing on (tracing.ts starts it): the SDK's batch
 * processor and OTLP/HTTP export run here, so the process's event loop, which serves its
 * requests, runs none of that. Spans recorded on the event loop arrive in one of two forms:
 *
 * - OTLP/protobuf (the default): `{ kind: 'encoded', bytes, ends }`, each span already encoded
 *   by the SDK's span rules (tracing-span-data.ts); each is handed to the batch processor as it
 *   is, and a batch is exported as its spans' bytes under this process's resource and scope.
 * - OTLP/JSON: `{ kind: 'spans', ...SpanBatch }`, records made into SDK spans by `SdkReplay` for
 *   the SDK's JSON exporter.
 *
 * Then `{ kind: 'shutdown' }` (flush and stop; answered `{ kind: 'closed' }`). The thread reads
 * the same OTEL_* environment as the process (sampler, batching, endpoint, headers).
 */
import { parentPort, workerData } from 'node:worker_threads';
import { diag, DiagLogLevel, TraceFlags } from '@opentelemetry/api';
import type { ReadableSpan } from '@opentelemetry/sdk-trace-node';
import type { EncodedSpan } from './otlp-protobuf.js';
import type { SpanBatch } from './tracing-deferred.js';

export type ExporterMessage = ({ kind: 'spans' } & SpanBatch) | { kind: 'encoded'; bytes: Uint8Array; ends: Uint32Array } | { kind: 'shutdown' };
/** `diag`: a warning or error the SDK reported on the thread (a failed export), for the process's log. */
export type ExporterReply = { kind: 'closed' } | { kind: 'diag'; level: 'warn' | 'error'; message: string };

export interface ExporterData {
  /** `service.name`, as the process resolved it (`OTEL_SERVICE_NAME` or the process's own). */
  service: string;
  version: string;
}

async function main(): Promise<void> {
  const port = parentPort;
  if (!port) throw new Error('tracing-worker runs as a worker thread');
  const data = workerData as ExporterData;
  const [{ resourceFromAttributes }, sdk, { ATTR_SERVICE_NAME, ATTR_SERVICE_VERSION }, { exportProcessor }, { PooledIdGenerator }, { SdkReplay, recordsOf }, tracing] = await Promise.all([
    import('@opentelemetry/resources'),
    import('@opentelemetry/sdk-trace-node'),
    import('@opentelemetry/semantic-conventions'),
    import('./tracing-export.js'),
    import('./trace-ids.js'),
    import('./tracing-deferred.js'),
    import('./tracing.js'),
  ]);
  // The SDK reports failed exports through its diagnostic logger: handed to the process's log.
  // The same report goes to the process at most once a minute, as the process logs it: a
  // collector that fails (or answers oddly) every export must not wake the event loop each time.
  const reported = new Map<string, number>();
  const say = (level: 'warn' | 'error') => (message: string, ...args: unknown[]): void => {
    const now = Date.now();
    if (now - (reported.get(message) ?? -Infinity) < tracing.REPORT_EVERY_MS) return;
    reported.set(message, now);
    const detail = args.map((a) => (a instanceof Error ? a.message : typeof a === 'string' ? a : JSON.stringify(a) ?? String(a)));
    port.postMessage({ kind: 'diag', level, message: [message, ...detail].join(' ') } satisfies ExporterReply);
  };
  const quiet = (): void => undefined;
  diag.setLogger({ error: say('error'), warn: say('warn'), info: quiet, debug: quiet, verbose: quiet }, DiagLogLevel.WARN);
  const ids = new PooledIdGenerator();
  const resource = resourceFromAttributes({ [ATTR_SERVICE_NAME]: data.service, [ATTR_SERVICE_VERSION]: data.version });
  const processor = await exportProcessor(tracing.otlpProtocol(), tracing.batchDefaults());
  const provider = new sdk.BasicTracerProvider({ resource, idGenerator: ids, sampler: tracing.samplerFromEnv(sdk), spanProcessors: [processor] });
  const replay = new SdkReplay(provider.getTracer('agentplane', data.version), ids);
  // An encoded span in the batch processor: the processor reads its trace flags (every encoded
  // span was sampled) and its resource; the exporter (tracing-export.ts) copies its bytes.
  const scope = { name: 'agentplane', version: data.version };
  const sampled = { traceId: '', spanId: '', traceFlags: TraceFlags.SAMPLED };
  const spanContext = () => sampled;
  port.on('message', (msg: ExporterMessage) => {
    if (msg.kind === 'encoded') {
      let from = 0;
      for (const end of msg.ends) {
        const span: EncodedSpan & Pick<ReadableSpan, 'spanContext'> = { encoded: msg.bytes.subarray(from, end), resource, instrumentationScope: scope, spanContext };
        // The processor takes any object with those fields; its type names the SDK's span.
        processor.onEnd(span as unknown as ReadableSpan);
        from = end;
      }
      return;
    }
    if (msg.kind === 'spans') {
      replay.write(recordsOf(msg));
      return;
    }
    provider.shutdown().catch(() => undefined).finally(() => {
      port.postMessage({ kind: 'closed' } satisfies ExporterReply);
      port.close();
    });
  });
}

void main();
