// Simulated runners for bench:dispatch: N real WebSocket clients speaking the runner protocol.
// Each accepts every offer at once, appends one agent.message event once it has the offer's spec
// (in the offer, or in the lease.spec frame that follows it: they speak lease-spec-v1), then
// completes the lease.
// Reports to the parent over IPC: {kind: 'leased', session_id, at} when an offer arrives.
import { WebSocket } from 'ws';
import { frame, LEASE_SPEC_PROTOCOL, MODEL_GATEWAY_PROTOCOL } from '@agentplane/protocol';
import { wallMs } from '../lib/report.js';

const [baseUrl, secretsJson] = [process.argv[2] as string, process.argv[3] as string];
const secrets = JSON.parse(secretsJson) as string[];
const SLOTS = 16;
let seq = 0;
const id = () => `s${(++seq).toString(36)}`;

interface Offer { lease_id: string; attempt: number; session_id: string; run_id: string; spec?: unknown }

function runner(secret: string): Promise<void> {
  return new Promise((resolve, reject) => {
    const ws = new WebSocket(`${baseUrl.replace('http', 'ws')}/v1/runners/connect`, { headers: { authorization: `Bearer ${secret}` } });
    let held = 0;
    /** Accepted offers waiting for their spec, by lease id: their Session. */
    const awaiting = new Map<string, string>();
    const work = (ref: { lease_id: string; attempt: number }, sessionId: string) =>
      ws.send(frame('events.batch', id(), { ...ref, session_id: sessionId, events: [{ producer_key: `${ref.lease_id}:0`, type: 'agent.message', payload: { content: [{ type: 'text', text: 'hi' }] } }] }));
    let heartbeat: NodeJS.Timeout | undefined;
    // As the daemon does: a freed slot is reported at once when the control plane counts this
    // runner full (the slots of its last heartbeat all taken by offers accepted since).
    let reported = SLOTS;
    let acceptedSince = 0;
    let lastEarly = 0;
    let early: NodeJS.Timeout | undefined;
    const beat = () => {
      reported = Math.max(0, SLOTS - held);
      acceptedSince = 0;
      ws.send(frame('heartbeat', id(), { status: 'ready', available_slots: reported, held_leases: [] }));
    };
    const slotFreed = () => {
      if (!heartbeat || early || reported - acceptedSince > 0) return;
      const go = () => {
        early = undefined;
        lastEarly = Date.now();
        beat();
      };
      const wait = lastEarly + 250 - Date.now();
      if (wait <= 0) go();
      else early = setTimeout(go, wait);
    };
    const caps = () => ({
      protocol_versions: [1], available_slots: Math.max(0, SLOTS - held), drivers: ['docker'], plane_protocols: [MODEL_GATEWAY_PROTOCOL, LEASE_SPEC_PROTOCOL],
      providers: [{ id: 'docker', drivers: ['docker'], tiers: ['container'], network_modes: ['none'], retention_modes: ['durable'],
        maximum_resources: { cpu_millis: 64_000, memory_mib: 65_536, disk_mib: 1_000_000, max_duration_seconds: 86_400 } }],
    });
    ws.on('open', () => ws.send(frame('hello', id(), { protocol_versions: [1], daemon_version: 'bench', status: 'ready', capabilities: caps(), held_leases: [] })));
    ws.on('error', reject);
    ws.on('message', (d) => {
      const m = JSON.parse(d.toString()) as { type: string; payload: Record<string, unknown> };
      if (m.type === 'welcome') {
        const every = Number(m.payload.heartbeat_interval_ms);
        heartbeat = setInterval(beat, every);
        resolve();
      } else if (m.type === 'lease.offer') {
        const o = m.payload as unknown as Offer;
        process.send?.({ kind: 'leased', session_id: o.session_id, at: wallMs() });
        held++;
        acceptedSince++;
        const ref = { lease_id: o.lease_id, attempt: o.attempt };
        ws.send(frame('lease.accept', id(), ref));
        if (o.spec) work(ref, o.session_id);
        else awaiting.set(o.lease_id, o.session_id);
      } else if (m.type === 'lease.spec') {
        const sessionId = awaiting.get(String(m.payload.lease_id));
        if (sessionId === undefined) return;
        awaiting.delete(String(m.payload.lease_id));
        const ref = { lease_id: String(m.payload.lease_id), attempt: Number(m.payload.attempt) };
        if (m.payload.spec) work(ref, sessionId);
        else ws.send(frame('lease.fail', id(), { ...ref, failure_class: 'infrastructure', reason: String(m.payload.error ?? 'no spec') }));
      } else if (m.type === 'events.ack') {
        const ref = { lease_id: String(m.payload.lease_id), attempt: Number(m.payload.attempt) };
        ws.send(frame('lease.complete', id(), { ...ref, result: { stop_reason: { type: 'end_turn' } } }));
        held = Math.max(0, held - 1);
        slotFreed();
      } else if (m.type === 'lease.revoked') {
        awaiting.delete(String(m.payload.lease_id));
        held = Math.max(0, held - 1);
        slotFreed();
      }
    });
    ws.on('close', () => {
      clearInterval(heartbeat);
      clearTimeout(early);
    });
  });
}

Promise.all(secrets.map(runner)).then(
  () => process.send?.({ kind: 'ready' }),
  (err: unknown) => {
    process.stderr.write(`simulated runners failed: ${String(err)}\n`);
    process.exit(1);
  },
);
