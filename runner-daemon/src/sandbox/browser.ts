/**
 * Chromium in a Session's sandbox, reached without giving the sandbox a network: the browser
 * runs with `--remote-debugging-pipe` under an exec whose stdin and stdout are the DevTools
 * pipe (the protocol's NUL-separated JSON messages), and the runner bridges that exec to a
 * WebSocket on its own loopback interface, with an unguessable path, accepting one connection,
 * for playwright-core's `connectOverCDP`. The exec runs under the driver's process-group
 * wrapper: closing the browser (or losing it) kills Chromium and every process it started.
 */
import { randomBytes } from 'node:crypto';
import type { AddressInfo } from 'node:net';
import { chromium } from 'playwright-core';
import { WebSocketServer, type WebSocket } from 'ws';
import { BROWSER_BINARY } from './browser-image.js';
import type { Sandbox, SandboxDriver } from './types.js';
import { CHROMIUM_FLAGS, type LaunchedBrowser } from '../harness/tools/browser-session.js';

/** Lines of Chromium's stderr kept for a crash report. */
const STDERR_LINES = 20;

/**
 * The longest DevTools message the bridge holds while waiting for its NUL terminator. The pipe is
 * reachable from inside the sandbox (any process there can write to the exec's stdout), so its
 * content is untrusted: past this bound the bridge closes and the browser session ends, rather
 * than the runner's memory growing. Below the WebSocket's `maxPayload`, far above any real message
 * (a full-page screenshot is a few MiB of base64).
 */
export const MAX_BROWSER_FRAME_BYTES = 64 * 1024 * 1024;

/**
 * Splits the browser's pipe into NUL-terminated messages, scanning each chunk once and holding at
 * most `maxBytes` of an unfinished message: a longer one calls `onOverflow` once, and everything
 * after it is dropped.
 */
export class FrameSplitter {
  private parts: Buffer[] = [];
  private size = 0;
  private failed = false;

  constructor(
    private readonly onFrame: (frame: Buffer) => void,
    private readonly onOverflow: () => void,
    private readonly maxBytes: number = MAX_BROWSER_FRAME_BYTES,
  ) {}

  push(chunk: Buffer): void {
    if (this.failed) return;
    let start = 0;
    for (let nul = chunk.indexOf(0); nul !== -1; nul = chunk.indexOf(0, start)) {
      if (!this.take(chunk.subarray(start, nul))) return;
      const frame = this.parts.length === 1 ? (this.parts[0] as Buffer) : Buffer.concat(this.parts, this.size);
      this.parts = [];
      this.size = 0;
      start = nul + 1;
      this.onFrame(frame);
      if (this.failed) return;
    }
    this.take(chunk.subarray(start));
  }

  /** Holds nothing more and drops whatever arrives later. */
  stop(): void {
    this.failed = true;
    this.parts = [];
    this.size = 0;
  }

  private take(piece: Buffer): boolean {
    if (this.size + piece.length > this.maxBytes) {
      this.stop();
      this.onOverflow();
      return false;
    }
    if (piece.length > 0) {
      this.parts.push(piece);
      this.size += piece.length;
    }
    return true;
  }
}

/** The command that starts Chromium on the exec's stdio (fd 3 ← stdin, fd 4 → stdout). */
export function pipeCommand(profile: string): string[] {
  return ['bash', '-c', 'exec 3<&0 4>&1 1>&2; exec "$@"', 'chromium', BROWSER_BINARY, ...CHROMIUM_FLAGS, '--remote-debugging-pipe', `--user-data-dir=${profile}`, 'about:blank'];
}

/** A browser profile directory name unique to one launch (its processes can be told apart by it). */
export function profileDir(): string {
  return `/tmp/.agentplane-browser-${randomBytes(6).toString('hex')}`;
}

/**
 * Starts Chromium in `sandbox` and connects playwright-core to it through the runner-side bridge.
 * `timeoutMs` bounds the start.
 */
export async function launchInSandbox(driver: Pick<SandboxDriver, 'spawn'>, sandbox: Sandbox, options: { timeoutMs?: number; profile?: string } = {}): Promise<LaunchedBrowser & { profile: string }> {
  const profile = options.profile ?? profileDir();
  const proc = await driver.spawn(sandbox, pipeCommand(profile), { env: { HOME: '/home/agent' } });
  const stderr: string[] = [];
  let partial = '';
  proc.stderr.on('data', (chunk: Buffer) => {
    const lines = (partial + chunk.toString('utf8')).split('\n');
    partial = lines.pop() ?? '';
    for (const l of lines) if (l.trim() && !/dbus|DBus/.test(l)) stderr.push(l.slice(0, 500));
    if (stderr.length > STDERR_LINES) stderr.splice(0, stderr.length - STDERR_LINES);
  });
  proc.stdin.on('error', () => undefined);
  const token = randomBytes(16).toString('hex');
  const wss = new WebSocketServer({ host: '127.0.0.1', port: 0, path: `/${token}`, maxPayload: 256 * 1024 * 1024 });
  await new Promise<void>((resolve, reject) => {
    wss.once('listening', resolve);
    wss.once('error', reject);
  });
  let socket: WebSocket | null = null;
  /** Why the bridge closed the browser itself (undefined: it did not). */
  let failure: string | undefined;
  const splitter = new FrameSplitter(
    (msg) => {
      if (socket?.readyState === 1) socket.send(msg.toString('utf8'));
    },
    () => {
      failure = `the browser's DevTools pipe carried a message longer than ${MAX_BROWSER_FRAME_BYTES} bytes (written from inside the sandbox?); the browser was closed`;
      // The browser session ends here; the pipe's further bytes are read and dropped until the exec is gone.
      wss.close();
      socket?.terminate();
      void proc.kill().catch(() => undefined);
    },
  );
  proc.stdout.on('data', (chunk: Buffer) => splitter.push(chunk));
  wss.on('connection', (ws) => {
    if (socket) {
      ws.close();
      return;
    }
    socket = ws;
    // One client only: nothing else on this machine may reach the browser.
    wss.close();
    ws.on('message', (data: Buffer | string) => {
      const text = typeof data === 'string' ? data : Buffer.from(data as Buffer).toString('utf8');
      proc.stdin.write(text + '\0');
    });
    ws.on('close', () => void proc.kill().catch(() => undefined));
  });
  const exited = proc.wait().then(() => {
    socket?.close();
    wss.close();
  });
  void exited;
  const port = (wss.address() as AddressInfo).port;
  const close = async (): Promise<void> => {
    splitter.stop();
    wss.close();
    socket?.terminate();
    await proc.kill().catch(() => undefined);
  };
  try {
    const browser = await chromium.connectOverCDP(`ws://127.0.0.1:${port}/${token}`, { timeout: options.timeoutMs ?? 30_000 });
    return { browser, close: async () => {
      await browser.close().catch(() => undefined);
      await close();
    }, diagnostics: () => [...(failure ? [failure] : []), ...stderr].join('\n'), failure: () => failure, profile };
  } catch (err) {
    await close();
    const diag = [...(failure ? [failure] : []), ...stderr].join('\n');
    throw new Error(`${(err as Error).message.split('\n')[0]}${diag ? `\n${diag}` : ''}`);
  }
}
