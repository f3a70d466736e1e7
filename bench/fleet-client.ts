/**
 * One process of simulated runners for bench/fleet.ts: real WebSocket clients that connect,
 * say hello (or send the same bytes to the echo floor), then heartbeat on an interval.
 */
import { WebSocket } from 'ws';
import { frame, type RunnerCapabilities } from '@agentplane/protocol';

interface ConnectCmd {
  cmd: 'connect';
  url: string;
  secrets: string[];
  mode: 'gateway' | 'echo';
  heartbeatMs: number;
  concurrency: number;
}

const CAPS: RunnerCapabilities = {
  protocol_versions: [1], available_slots: 2, drivers: ['docker', 'process'], plane_protocols: ['model-gateway-v1'],
  providers: [{ id: 'docker', drivers: ['docker'], tiers: ['container'], platforms: [{ os: 'linux', architecture: 'amd64' }], network_modes: ['none'], acp_transport: 'stdio' }],
};
const HELLO = frame('hello', 'h', { protocol_versions: [1], daemon_version: 'bench', status: 'ready', capabilities: CAPS, held_leases: [] });
const HEARTBEAT = frame('heartbeat', 'b', { status: 'ready', available_slots: 2, held_leases: [] });

const sockets: WebSocket[] = [];
let acks = 0;
let closedEarly = 0;

function connectOne(c: ConnectCmd, secret: string): Promise<number> {
  return new Promise((resolve, reject) => {
    const t0 = performance.now();
    const ws = new WebSocket(c.url, { headers: { authorization: `Bearer ${secret}` }, perMessageDeflate: false });
    let ready = false;
    ws.on('open', () => ws.send(HELLO));
    ws.on('message', () => {
      if (!ready) {
        ready = true;
        sockets.push(ws);
        const jitter = Math.random() * c.heartbeatMs;
        setTimeout(() => {
          ws.send(HEARTBEAT);
          setInterval(() => ws.readyState === ws.OPEN && ws.send(HEARTBEAT), c.heartbeatMs);
        }, jitter);
        resolve(performance.now() - t0);
      } else {
        acks++;
      }
    });
    ws.on('error', (err) => !ready && reject(err));
    ws.on('close', () => {
      if (!ready) reject(new Error('closed before ready'));
      else closedEarly++;
    });
  });
}

process.on('message', (m: ConnectCmd | { cmd: 'stats' } | { cmd: 'stop' }) => {
  if (m.cmd === 'connect') {
    const latencies: number[] = [];
    let failed = 0;
    let next = 0;
    const worker = async () => {
      while (next < m.secrets.length) {
        const s = m.secrets[next++]!;
        try {
          latencies.push(await connectOne(m, s));
        } catch {
          failed++;
        }
      }
    };
    void Promise.all(Array.from({ length: m.concurrency }, worker)).then(() => process.send?.({ kind: 'connected', latencies, failed }));
  } else if (m.cmd === 'stats') {
    process.send?.({ kind: 'stats', acks, open: sockets.filter((s) => s.readyState === s.OPEN).length, closedEarly });
  } else {
    for (const s of sockets) s.close(1000);
    setTimeout(() => process.exit(0), 500);
  }
});
process.send?.({ kind: 'up' });
