/**
 * The exporter thread of a process with tracing on (tracing.ts starts it): spans recorded on the
 * event loop arrive here as batches of `SpanRecord`s (`SpanBatch`), are made into SDK spans by `SdkReplay`
 * and go through the SDK's batch processor and OTLP/HTTP exporter from this thread, so the
 * process's event loop, which serves its requests, runs none of that.
 *
 * Messages from the process: `{ kind: 'spans', ...SpanBatch }`, then `{ kind: 'shutdown' }` (flush and
 * stop; answered `{ kind: 'closed' }`). The thread reads the same OTEL_* environment as the
 * process (sampler, batching, endpoint, headers).
 */
import { parentPort, workerData } from 'node:worker_threads';
import { diag, DiagLogLevel } from '@opentelemetry/api';
import type { SpanBatch } from './tracing-deferred.js';

export type ExporterMessage = ({ kind: 'spans' } & SpanBatch) | { kind: 'shutdown' };
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
  // The SDK reports failed exports through its diagnostic logger: handed to the process's log.
  const say = (level: 'warn' | 'error') => (message: string, ...args: unknown[]): void => {
    const detail = args.map((a) => (a instanceof Error ? a.message : typeof a === 'string' ? a : JSON.stringify(a) ?? String(a)));
    port.postMessage({ kind: 'diag', level, message: [message, ...detail].join(' ') } satisfies ExporterReply);
  };
  const quiet = (): void => undefined;
  diag.setLogger({ error: say('error'), warn: say('warn'), info: quiet, debug: quiet, verbose: quiet }, DiagLogLevel.WARN);
  const [{ resourceFromAttributes }, sdk, { ATTR_SERVICE_NAME, ATTR_SERVICE_VERSION }, { exportProcessor }, { PooledIdGenerator }, { SdkReplay, recordsOf }, tracing] = await Promise.all([
    import('@opentelemetry/resources'),
    import('@opentelemetry/sdk-trace-node'),
    import('@opentelemetry/semantic-conventions'),
    import('./tracing-export.js'),
    import('./trace-ids.js'),
    import('./tracing-deferred.js'),
    import('./tracing.js'),
  ]);
  const ids = new PooledIdGenerator();
  const provider = new sdk.BasicTracerProvider({
    resource: resourceFromAttributes({ [ATTR_SERVICE_NAME]: data.service, [ATTR_SERVICE_VERSION]: data.version }),
    idGenerator: ids,
    sampler: tracing.samplerFromEnv(sdk),
    spanProcessors: [await exportProcessor(tracing.otlpProtocol(), tracing.batchDefaults())],
  });
  const replay = new SdkReplay(provider.getTracer('agentplane', data.version), ids);
  port.on('message', (msg: ExporterMessage) => {
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
