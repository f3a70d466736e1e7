import type { Logger } from '@agentplane/core';
import type { Gateway, RunnerConnection } from '@agentplane/gateway';
import type { LeaseRef } from '@agentplane/protocol';
import { ModelStreams } from './model-streams.js';
import type { ModelsModule } from './module.js';

/** Who a lease works for; the scheduler knows. */
export interface LeaseAttribution {
  session_id?: string | undefined;
  thread_id?: string | undefined;
  run_id?: string | undefined;
}

/**
 * Resolve a lease a runner names in `model.request` to its Run. Null = this runner does not
 * hold that lease (the step is refused). Without a resolver, steps are billed to the
 * runner's workspace only.
 */
export type LeaseResolver = (runner: RunnerConnection, lease: LeaseRef) => Promise<LeaseAttribution | null>;

export interface ModelFramesOptions {
  resolveLease?: LeaseResolver;
  maxStreamsPerConnection?: number;
}

/**
 * Serve model-gateway-v1 over the runner WebSocket: `model.request` starts a step (streamed
 * back as `model.delta` frames and one `model.end`), `model.cancel` aborts it, and a socket
 * that is gone aborts its provider requests at the next event. The runner only ever sees
 * neutral model events: credentials and secrets stay in this process.
 */
export function registerModelFrames(gateway: Pick<Gateway, 'on'>, models: ModelsModule, log: Logger, options: ModelFramesOptions = {}): void {
  const byConn = new Map<string, ModelStreams>();
  const streamsOf = (conn: RunnerConnection): ModelStreams => {
    let s = byConn.get(conn.id);
    if (!s) {
      s = new ModelStreams(
        models.gateway,
        (f) => conn.send(f.type, { stream_id: f.stream_id, event: f.event }),
        log,
        options.maxStreamsPerConnection === undefined ? {} : { maxStreams: options.maxStreamsPerConnection },
      );
      byConn.set(conn.id, s);
    }
    return s;
  };

  gateway.on('model.request', async (conn, msg) => {
    const { stream_id, request, lease_id, attempt } = msg.payload;
    const streams = streamsOf(conn);
    let who: LeaseAttribution = {};
    if (options.resolveLease) {
      const resolved = await options.resolveLease(conn, { lease_id, attempt });
      if (!resolved) {
        conn.send('model.end', { stream_id, event: { type: 'error', error: { type: 'validation.not_found', message: 'this runner holds no such lease', retryable: false } } });
        return;
      }
      who = resolved;
    }
    const workspaceId = conn.identity.workspaceId;
    void streams
      .open(workspaceId, stream_id, request, who)
      .finally(() => {
        if (streams.size === 0 && byConn.get(conn.id) === streams) byConn.delete(conn.id);
      });
  });

  gateway.on('model.cancel', (conn, msg) => {
    byConn.get(conn.id)?.cancel(msg.payload.stream_id);
  });
}
