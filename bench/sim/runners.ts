// Simulated runners for bench:dispatch: N real WebSocket clients speaking the runner protocol.
// Each accepts every offer at once, appends one agent.message event once it has the offer's spec
// (in the offer, or in its lease.spec frame: they speak lease-spec-v1; a spec that overtook its
// offer is kept for it, as the daemon keeps one), then completes the lease.
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
    /**
     * Specs that came before their offer, by lease id, as the daemon keeps them: an offer sent
     * by pub/sub while the scheduler's link to the node opens can be overtaken by its spec, sent
     * over the link once it is open.
     */
    const earlySpecs = new Map<string, Record<string, unknown>>();
    const withSpec = (ref: { lease_id: string; attempt: number }, sessionId: string, p: Record<string, unknown>) => {
      if (p.spec) work(ref, sessionId);
      else ws.send(frame('lease.fail', id(), { ...ref, failure_class: 'infrastructure', reason: String(p.error ?? 'no spec') }));
    };
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
        const spec = earlySpecs.get(o.lease_id);
        earlySpecs.delete(o.lease_id);
        if (o.spec) work(ref, o.session_id);
        else if (spec) withSpec(ref, o.session_id, spec);
        else awaiting.set(o.lease_id, o.session_id);
      } else if (m.type === 'lease.spec') {
        const leaseId = String(m.payload.lease_id);
        const sessionId = awaiting.get(leaseId);
        if (sessionId === undefined) {
          earlySpecs.set(leaseId, m.payload);
          if (earlySpecs.size > 1000) earlySpecs.delete(earlySpecs.keys().next().value as string);
          return;
        }
        awaiting.delete(leaseId);
        withSpec({ lease_id: leaseId, attempt: Number(m.payload.attempt) }, sessionId, m.payload);
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
