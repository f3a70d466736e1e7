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
import { LineSplitter } from '../harness/colocated/protocol.js';
import type { SandboxProcess } from '../sandbox/types.js';

/**
 * The longest line either end holds while waiting for its newline. A line carries one TCP chunk
 * of one connection in base64 (at most a few hundred KiB); the forwarder's stdout is writable from
 * anywhere in the sandbox, so a longer line ends the forwarder instead of growing the runner.
 */
export const FORWARDER_MAX_LINE_BYTES = 4 * 1024 * 1024;

/** Connections to the model endpoint the forwarder carries at once; further ones are refused. */
export const FORWARDER_MAX_CONNECTIONS = 64;

/** The in-sandbox program. Plain JavaScript, node built-ins only. */
export const FORWARDER_SOURCE = `
const net = require('node:net');
const MAX_LINE = ${FORWARDER_MAX_LINE_BYTES};
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
const handle = (line) => {
  let m;
  try { m = JSON.parse(line); } catch { return; }
  if (!m || typeof m !== 'object') return;
  const s = socks.get(m.c);
  if (!s) return;
  if (m.t === 'data' && typeof m.d === 'string') s.write(Buffer.from(m.d, 'base64'));
  else if (m.t === 'end') { socks.delete(m.c); s.end(); }
};
let parts = [];
let size = 0;
const take = (piece) => {
  size += piece.length;
  if (size > MAX_LINE) {
    process.stderr.write('a line from the runner is longer than ' + MAX_LINE + ' bytes\\n');
    process.exit(1);
  }
  if (piece.length > 0) parts.push(piece);
};
process.stdin.on('data', (chunk) => {
  let from = 0;
  for (let i = chunk.indexOf(10); i !== -1; i = chunk.indexOf(10, from)) {
    take(chunk.subarray(from, i));
    const line = Buffer.concat(parts, size).toString('utf8');
    parts = [];
    size = 0;
    from = i + 1;
    if (line) handle(line);
  }
  take(chunk.subarray(from));
});
process.stdin.on('end', () => process.exit(0));
`;

interface Line {
  t: 'listening' | 'open' | 'data' | 'end';
  c: number;
  port?: number;
  d?: string;
}

/** One line from the sandbox, if it is one the protocol knows (anything else is ignored). */
function parseLine(raw: string): Line | undefined {
  let v: unknown;
  try {
    v = JSON.parse(raw);
  } catch {
    return undefined;
  }
  if (typeof v !== 'object' || v === null) return undefined;
  const m = v as Record<string, unknown>;
  if (m.t !== 'listening' && m.t !== 'open' && m.t !== 'data' && m.t !== 'end') return undefined;
  const c = m.c ?? 0;
  if (typeof c !== 'number' || !Number.isSafeInteger(c)) return undefined;
  if (m.port !== undefined && typeof m.port !== 'number') return undefined;
  if (m.d !== undefined && typeof m.d !== 'string') return undefined;
  return { t: m.t, c, ...(typeof m.port === 'number' ? { port: m.port } : {}), ...(typeof m.d === 'string' ? { d: m.d } : {}) };
}

export interface BridgeOptions {
  /** Bound on the forwarder's start (its `listening` line). Default 15 s. */
  timeoutMs?: number;
  /** Connections carried at once. Default `FORWARDER_MAX_CONNECTIONS`. */
  maxConnections?: number;
  /** Longest line accepted from the sandbox. Default `FORWARDER_MAX_LINE_BYTES`. */
  maxLineBytes?: number;
  /**
   * The bridge stopped the forwarder after it started (a line over the bound): the sandbox's model
   * endpoint is gone for the rest of the Run. Before the start, the returned promise rejects instead.
   */
  onFailure?: (err: Error) => void;
}

/**
 * The runner end: bridges the forwarder's connections to `port` on the runner's loopback.
 * Resolves with the port the forwarder listens on inside the sandbox. Everything the forwarder
 * writes is untrusted (any process in the sandbox can write to its stdout): lines are bounded,
 * so are connections, and malformed lines are ignored.
 */
export function bridgeForwarder(proc: SandboxProcess, port: number, timeoutOrOptions: number | BridgeOptions = {}): Promise<number> {
  const options = typeof timeoutOrOptions === 'number' ? { timeoutMs: timeoutOrOptions } : timeoutOrOptions;
  const timeoutMs = options.timeoutMs ?? 15_000;
  const maxConnections = options.maxConnections ?? FORWARDER_MAX_CONNECTIONS;
  const conns = new Map<number, Socket>();
  const send = (m: { t: 'data' | 'end'; c: number; d?: string }): void => {
    if (proc.stdin.writable) proc.stdin.write(`${JSON.stringify(m)}\n`);
  };
  const dropAll = (): void => {
    for (const s of conns.values()) s.destroy();
    conns.clear();
  };
  let stderr = '';
  proc.stderr.on('data', (c: Buffer) => (stderr = (stderr + c.toString('utf8')).slice(-2000)));
  return new Promise<number>((resolve, reject) => {
    let started = false;
    let failed = false;
    const timer = setTimeout(() => reject(new Error(`the model forwarder did not start within ${timeoutMs} ms: ${stderr.trim()}`)), timeoutMs);
    void proc.wait().then(({ exitCode }) => {
      clearTimeout(timer);
      dropAll();
      reject(new Error(`the model forwarder exited (code ${exitCode}): ${stderr.trim()}`));
    });
    const onLine = (raw: string): void => {
      const m = parseLine(raw);
      if (!m) return;
      const c = m.c;
      if (m.t === 'listening' && typeof m.port === 'number') {
        clearTimeout(timer);
        started = true;
        resolve(m.port);
      } else if (m.t === 'open') {
        // A connection id in use, or one too many: refused (the sandbox end closes it).
        if (conns.has(c) || conns.size >= maxConnections) {
          send({ t: 'end', c });
          return;
        }
        const s = connect(port, '127.0.0.1');
        conns.set(c, s);
        s.on('data', (d: Buffer) => send({ t: 'data', c, d: d.toString('base64') }));
        s.on('end', () => send({ t: 'end', c }));
        s.on('error', () => send({ t: 'end', c }));
        s.on('close', () => {
          if (conns.get(c) === s) conns.delete(c);
        });
      } else if (m.t === 'data' && m.d) conns.get(c)?.write(Buffer.from(m.d, 'base64'));
      else if (m.t === 'end') conns.get(c)?.end();
    };
    const splitter = new LineSplitter(onLine, () => {
      if (failed) return;
      failed = true;
      const err = new Error(`the model forwarder wrote a line longer than ${options.maxLineBytes ?? FORWARDER_MAX_LINE_BYTES} bytes (written from inside the sandbox?); it was stopped`);
      clearTimeout(timer);
      dropAll();
      void proc.kill().catch(() => undefined);
      if (started) options.onFailure?.(err);
      else reject(err);
    }, options.maxLineBytes ?? FORWARDER_MAX_LINE_BYTES);
    // Once stopped, the splitter drops what still arrives until the process is gone.
    proc.stdout.on('data', (chunk: Buffer) => splitter.push(chunk));
  });
}
