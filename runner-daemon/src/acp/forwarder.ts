/**
 * The sandbox end of the model endpoint (docs/ACP.md). The sandbox has no network (`--network
 * none`), but it has a loopback interface: a small Node program started inside it
 * (`node -e FORWARDER_SOURCE`, through the driver like any sandbox command) listens on
 * 127.0.0.1 and carries each TCP connection's bytes over its own stdio, as JSON lines, to the
 * runner, which opens a connection to its loopback model endpoint for each and pipes the bytes
 * back. Nothing leaves the sandbox except through the runner, and the runner serves only the
 * endpoint. Stdio, not a mounted Unix socket, because it works the same under every driver and
 * tier (gVisor does not pass host Unix sockets through bind mounts by default).
 *
 * Lines, sandbox → runner: `{"t":"listening","port":n}`, `{"t":"open","c":id}`,
 * `{"t":"data","c":id,"d":base64}`, `{"t":"end","c":id}`. Runner → sandbox: `data`, `end`.
 */
import { connect, type Socket } from 'node:net';
import type { SandboxProcess } from '../sandbox/types.js';

/** The in-sandbox program. Plain JavaScript, node built-ins only. */
export const FORWARDER_SOURCE = `
const net = require('node:net');
const socks = new Map();
let seq = 0;
const out = (m) => process.stdout.write(JSON.stringify(m) + '\\n');
const server = net.createServer((s) => {
  const c = ++seq;
  socks.set(c, s);
  out({ t: 'open', c });
  s.on('data', (d) => out({ t: 'data', c, d: d.toString('base64') }));
  s.on('end', () => out({ t: 'end', c }));
  s.on('error', () => {});
  s.on('close', () => { if (socks.delete(c)) out({ t: 'end', c }); });
});
server.listen(Number(process.env.AGENTPLANE_MODEL_PORT || 0), '127.0.0.1', () => out({ t: 'listening', port: server.address().port }));
let buf = '';
process.stdin.on('data', (chunk) => {
  buf += chunk.toString('utf8');
  let i;
  while ((i = buf.indexOf('\\n')) >= 0) {
    const line = buf.slice(0, i);
    buf = buf.slice(i + 1);
    if (!line) continue;
    const m = JSON.parse(line);
    const s = socks.get(m.c);
    if (!s) continue;
    if (m.t === 'data') s.write(Buffer.from(m.d, 'base64'));
    else if (m.t === 'end') { socks.delete(m.c); s.end(); }
  }
});
process.stdin.on('end', () => process.exit(0));
`;

interface Line {
  t: 'listening' | 'open' | 'data' | 'end';
  c?: number;
  port?: number;
  d?: string;
}

/**
 * The runner end: bridges the forwarder's connections to `port` on the runner's loopback.
 * Resolves with the port the forwarder listens on inside the sandbox.
 */
export function bridgeForwarder(proc: SandboxProcess, port: number, timeoutMs = 15_000): Promise<number> {
  const conns = new Map<number, Socket>();
  const send = (m: { t: 'data' | 'end'; c: number; d?: string }): void => {
    if (proc.stdin.writable) proc.stdin.write(`${JSON.stringify(m)}\n`);
  };
  let buf = '';
  let stderr = '';
  proc.stderr.on('data', (c: Buffer) => (stderr = (stderr + c.toString('utf8')).slice(-2000)));
  return new Promise<number>((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`the model forwarder did not start within ${timeoutMs} ms: ${stderr.trim()}`)), timeoutMs);
    void proc.wait().then(({ exitCode }) => {
      clearTimeout(timer);
      for (const s of conns.values()) s.destroy();
      conns.clear();
      reject(new Error(`the model forwarder exited (code ${exitCode}): ${stderr.trim()}`));
    });
    proc.stdout.on('data', (chunk: Buffer) => {
      buf += chunk.toString('utf8');
      let i: number;
      while ((i = buf.indexOf('\n')) >= 0) {
        const raw = buf.slice(0, i);
        buf = buf.slice(i + 1);
        if (!raw) continue;
        let m: Line;
        try {
          m = JSON.parse(raw) as Line;
        } catch {
          continue;
        }
        const c = m.c ?? 0;
        if (m.t === 'listening' && typeof m.port === 'number') {
          clearTimeout(timer);
          resolve(m.port);
        } else if (m.t === 'open') {
          const s = connect(port, '127.0.0.1');
          conns.set(c, s);
          s.on('data', (d: Buffer) => send({ t: 'data', c, d: d.toString('base64') }));
          s.on('end', () => send({ t: 'end', c }));
          s.on('error', () => send({ t: 'end', c }));
          s.on('close', () => conns.delete(c));
        } else if (m.t === 'data' && m.d) conns.get(c)?.write(Buffer.from(m.d, 'base64'));
        else if (m.t === 'end') conns.get(c)?.end();
      }
    });
  });
}
