/**
 * A fake runner speaking the runner protocol directly: it opens the runner WebSocket with a
 * runner credential, sends `hello` and waits for `welcome`. Tests then send frames on `sock`
 * and read what the gateway sent in `frames` (parsed) or `raw` (as received).
 */
import { WebSocket } from 'ws';
import { frame, type Payload } from '@agentplane/protocol';
import { waitFor, type Platform } from './platform.js';

/** A frame as the gateway sends it; tests narrow `payload` with the type parameter. */
export interface RunnerFrame<P = unknown> {
  type: string;
  id: string;
  re?: string;
  payload: P;
}

export interface RawRunner<F extends RunnerFrame = RunnerFrame> {
  sock: WebSocket;
  /** Every frame received, parsed, in arrival order (the `welcome` is among them). */
  frames: F[];
  /** Every frame received, as text. */
  raw: string[];
  /** Resolves with the close code once the socket closes. */
  closed: Promise<number>;
}

/** The `hello` of a ready runner with one slot and the `process` driver. */
export const HELLO: Payload<'hello'> = {
  protocol_versions: [1], daemon_version: 'test', status: 'ready', held_leases: [],
  capabilities: { protocol_versions: [1], available_slots: 1, drivers: ['process'], plane_protocols: ['model-gateway-v1'], providers: [] },
};

/**
 * The `hello` of a ready runner with a `docker` provider (a container tier without network, room
 * for any Environment's resources), `slots` free, the plane protocols it speaks and the leases it
 * still holds from an earlier connection.
 */
export function dockerHello(planes: string[], options: { slots?: number; held?: Payload<'hello'>['held_leases'] } = {}): Payload<'hello'> {
  return {
    protocol_versions: [1], daemon_version: 'test', status: 'ready', held_leases: options.held ?? [],
    capabilities: {
      protocol_versions: [1], available_slots: options.slots ?? 1, drivers: ['docker'], plane_protocols: planes,
      providers: [{
        id: 'docker', drivers: ['docker'], tiers: ['container'], network_modes: ['none'], retention_modes: ['durable'],
        maximum_resources: { cpu_millis: 64_000, memory_mib: 65_536, disk_mib: 1_000_000, max_duration_seconds: 86_400 },
      }],
    },
  };
}

/** A runner credential's secret, from a pairing for `principal` redeemed at once. */
export async function pairedRunnerSecret(p: Pick<Platform, 'root' | 'anon'>, principal: string, label: string): Promise<string> {
  const pairing = await p.root.post<{ code: string }>('/v1/runner-pairings', { principal_id: principal, machine_label: label, expires_in_seconds: 600 }, { idempotencyKey: `pair-${label}` });
  return (await p.anon.post<{ secret: string }>('/v1/runner-pairings/redeem', { code: pairing.code })).secret;
}

/** The WebSocket URL runners connect to on a platform at `baseUrl`. */
export function runnerConnectUrl(baseUrl: string): string {
  return `${baseUrl.replace('http', 'ws')}/v1/runners/connect`;
}

/**
 * Connects with `secret` (a runner credential), says `hello` (by default `HELLO`) and resolves once `welcome` has
 * arrived (within 5 s). A socket that fails to get there is terminated before the error is thrown.
 */
export async function connectRawRunner<F extends RunnerFrame = RunnerFrame>(target: { baseUrl: string }, secret: string, hello: Payload<'hello'> = HELLO): Promise<RawRunner<F>> {
  const sock = new WebSocket(runnerConnectUrl(target.baseUrl), { headers: { authorization: `Bearer ${secret}` } });
  const frames: F[] = [];
  const raw: string[] = [];
  sock.on('message', (d) => {
    const text = d.toString();
    raw.push(text);
    frames.push(JSON.parse(text) as F);
  });
  const closed = new Promise<number>((r) => sock.on('close', (code) => r(code)));
  try {
    await new Promise<void>((resolve, reject) => {
      sock.once('open', () => resolve());
      sock.once('error', reject);
    });
    sock.send(frame('hello', 'h1', hello));
    await waitFor('welcome', () => (frames.some((f) => f.type === 'welcome') ? true : undefined), 5000);
  } catch (err) {
    sock.terminate();
    throw err;
  }
  return { sock, frames, raw, closed };
}

/** The `welcome` frame's payload (runner id and connection generation). */
export function welcomeOf(runner: { frames: readonly RunnerFrame[] }): { runner_id: string; generation: number } {
  const w = runner.frames.find((f) => f.type === 'welcome');
  if (!w) throw new Error('no welcome frame');
  return w.payload as { runner_id: string; generation: number };
}
