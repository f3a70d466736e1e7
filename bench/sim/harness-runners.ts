// Simulated runners for bench:fanout: N real WebSocket clients speaking the runner protocol that
// run each offered turn with the real harness loop and the scripted model in-process (no model
// gateway round trip, no policy check), with a command runner that answers `echo …` at once
// instead of a sandbox. Events go out one batch at a time, each acknowledged before the next,
// as the daemon's lease sink does; the lease completes with the harness's stop reason and waits.
import { WebSocket } from 'ws';
import { frame } from '@agentplane/protocol';
import type { ModelClient, ModelMessage } from '@agentplane/protocol';
import { ScriptedAdapter } from '@agentplane/models';
import { HarnessLoop, type AgentTool, type HarnessEvent, type PendingResponses } from '@agentplane/runner-daemon/harness';
import type { CommandRunner, Sandbox } from '@agentplane/runner-daemon/sandbox';

const [baseUrl, secretsJson] = [process.argv[2] as string, process.argv[3] as string];
const secrets = JSON.parse(secretsJson) as string[];
const SLOTS = 16;
let seq = 0;
const id = () => `h${(++seq).toString(36)}`;

interface Spec {
  thread_id: string;
  agent: { routing_key: string; system?: string; tools: AgentTool[] };
  history: ModelMessage[];
  responses?: PendingResponses;
}
interface Offer { lease_id: string; attempt: number; session_id: string; run_id: string; spec: Spec }

const scripted = new ScriptedAdapter();
const model: ModelClient = { stream: (request, signal) => scripted.stream({ request, model: 'scripted-1', baseUrl: null, apiKey: null }, signal) };
const driver: CommandRunner = {
  exec: async (_sandbox, command) => {
    const text = Array.isArray(command) ? command.join(' ') : command.script;
    const echo = /echo (.*)$/.exec(text.trim());
    return { exitCode: 0, stdout: echo ? `${echo[1]}\n` : '', stderr: '', truncated: false, timedOut: false, killed: false, oomKilled: false, durationMs: 0 };
  },
};
const sandbox: Sandbox = { sessionId: 'sim', driver: 'process', ref: '/tmp', workspace: '/tmp', createdAt: Date.now(), reused: true };

function runner(secret: string): Promise<void> {
  return new Promise((resolve, reject) => {
    const ws = new WebSocket(`${baseUrl.replace('http', 'ws')}/v1/runners/connect`, { headers: { authorization: `Bearer ${secret}` } });
    let held = 0;
    let heartbeat: NodeJS.Timeout | undefined;
    const acks = new Map<string, () => void>();
    const caps = () => ({
      protocol_versions: [1], available_slots: Math.max(0, SLOTS - held), drivers: ['docker'], plane_protocols: ['model-gateway-v1'],
      providers: [{ id: 'docker', drivers: ['docker'], tiers: ['container'], network_modes: ['none'], retention_modes: ['durable'],
        maximum_resources: { cpu_millis: 64_000, memory_mib: 65_536, disk_mib: 1_000_000, max_duration_seconds: 86_400 } }],
    });

    async function turn(o: Offer): Promise<void> {
      const ref = { lease_id: o.lease_id, attempt: o.attempt };
      ws.send(frame('lease.accept', id(), ref));
      let n = 0;
      const awaiting = new Map<string, string>();
      const sink = {
        emit: (e: HarnessEvent & { session_thread_id?: string }): Promise<void> => {
          if (e.type === 'session.status_idle') return Promise.resolve();
          if (e.type === 'agent.tool_use' && e.payload.blocking && e.payload.awaiting) awaiting.set(e.payload.id, e.payload.awaiting);
          const fid = id();
          const acked = new Promise<void>((r) => acks.set(fid, r));
          ws.send(frame('events.batch', fid, { ...ref, session_id: o.session_id, events: [{ producer_key: `${o.lease_id}:${n++}`, type: e.type, payload: e.payload }] }));
          return acked;
        },
      };
      const loop = new HarnessLoop({ model, driver, sandbox, sink });
      const out = await loop.run({ agent: o.spec.agent, history: o.spec.history, ...(o.spec.responses ? { responses: o.spec.responses } : {}), session_thread_id: o.spec.thread_id });
      const stop = out.stop_reason;
      const waits = stop.type === 'requires_action'
        ? stop.tool_use_ids.map((t) => ({ tool_use_id: t, kind: awaiting.get(t) === 'tool_confirmation' ? 'confirmation' : 'custom_tool' }))
        : undefined;
      ws.send(frame('lease.complete', id(), { ...ref, result: { stop_reason: stop, ...(waits ? { waits } : {}), usage: out.usage } }));
    }

    ws.on('open', () => ws.send(frame('hello', id(), { protocol_versions: [1], daemon_version: 'bench', status: 'ready', capabilities: caps(), held_leases: [] })));
    ws.on('error', reject);
    ws.on('message', (d) => {
      const m = JSON.parse(d.toString()) as { type: string; re?: string; payload: Record<string, unknown> };
      if (m.type === 'welcome') {
        const every = Number(m.payload.heartbeat_interval_ms);
        heartbeat = setInterval(() => ws.send(frame('heartbeat', id(), { status: 'ready', available_slots: Math.max(0, SLOTS - held), held_leases: [] })), every);
        resolve();
      } else if (m.type === 'lease.offer') {
        held++;
        const o = m.payload as unknown as Offer;
        turn(o).catch((err: unknown) => {
          process.stderr.write(`simulated turn failed: ${err instanceof Error ? err.message : String(err)}\n`);
          ws.send(frame('lease.fail', id(), { lease_id: o.lease_id, attempt: o.attempt, failure_class: 'work', reason: 'simulated turn failed' }));
        }).finally(() => (held = Math.max(0, held - 1)));
      } else if (m.type === 'events.ack' && m.re) {
        acks.get(m.re)?.();
        acks.delete(m.re);
      }
    });
    ws.on('close', () => clearInterval(heartbeat));
  });
}

Promise.all(secrets.map(runner)).then(
  () => process.send?.({ kind: 'ready' }),
  (err: unknown) => {
    process.stderr.write(`simulated runners failed: ${String(err)}\n`);
    process.exit(1);
  },
);
