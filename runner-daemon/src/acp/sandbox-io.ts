/**
 * The ACP client methods an agent calls on the runner (`fs/*`, `terminal/*`), served inside the
 * Session's sandbox and confined to its workspace: a path is resolved inside the sandbox
 * (`realpath -m`, symlinks followed) and refused unless it is the workspace or below it, in the
 * same command that then reads or writes it.
 */
import { randomBytes } from 'node:crypto';
import * as acp from '@agentclientprotocol/sdk';
import type { Sandbox, SandboxDriver, SandboxProcess } from '../sandbox/types.js';

const CONFINE = `w=$(realpath -m -- "$2") && cd -- "$w" && p=$(realpath -m -- "$1") || exit 3
case "$p" in "$w"|"$w"/*) ;; *) echo "outside the workspace: $1" >&2; exit 3;; esac`;

/** Largest file an agent reads or writes through the client (its answer travels as one JSON-RPC message). */
const MAX_FILE_BYTES = 8 * 1024 * 1024;

function refused(stderr: string, path: string): acp.RequestError {
  return new acp.RequestError(-32602, stderr.includes('outside the workspace') ? `${path} is outside the workspace` : `${path}: ${stderr.trim().slice(0, 500) || 'failed'}`);
}

export async function confinedPath(driver: SandboxDriver, sandbox: Sandbox, path: string): Promise<string> {
  const r = await driver.exec(sandbox, ['bash', '-c', `${CONFINE}\nprintf %s "$p"`, 'confine', path, sandbox.workspace], { timeoutMs: 10_000, maxOutputBytes: 8192 });
  if (r.exitCode !== 0) throw refused(r.stderr, path);
  return r.stdout;
}

export async function readConfined(driver: SandboxDriver, sandbox: Sandbox, path: string): Promise<string> {
  const r = await driver.exec(sandbox, ['bash', '-c', `${CONFINE}\ncat -- "$p"`, 'read', path, sandbox.workspace], { timeoutMs: 30_000, maxOutputBytes: MAX_FILE_BYTES });
  if (r.exitCode !== 0) throw refused(r.stderr, path);
  if (r.truncated) throw new acp.RequestError(-32602, `${path} is larger than ${MAX_FILE_BYTES} bytes`);
  return r.stdout;
}

export async function writeConfined(driver: SandboxDriver, sandbox: Sandbox, path: string, content: string): Promise<void> {
  if (Buffer.byteLength(content) > MAX_FILE_BYTES) throw new acp.RequestError(-32602, `the content is larger than ${MAX_FILE_BYTES} bytes`);
  const r = await driver.exec(sandbox, ['bash', '-c', `${CONFINE}\nmkdir -p -- "$(dirname -- "$p")" && cat > "$p"`, 'write', path, sandbox.workspace], {
    stdin: content, timeoutMs: 30_000, maxOutputBytes: 8192,
  });
  if (r.exitCode !== 0) throw refused(r.stderr, path);
}

interface Terminal {
  proc: SandboxProcess;
  out: Buffer;
  truncated: boolean;
  limit: number;
  exit: { exitCode: number | null; signal: string | null } | undefined;
  done: Promise<void>;
}

/** The agent's terminals: commands inside the sandbox, output kept up to the agent's limit. */
export class Terminals {
  private readonly all = new Map<string, Terminal>();

  constructor(
    private readonly driver: SandboxDriver,
    private readonly sandbox: Sandbox,
  ) {}

  async create(command: string, args: string[], cwd: string, env: Record<string, string>, limit = 1024 * 1024): Promise<string> {
    const argv = args.length > 0 ? [command, ...args] : ['bash', '-c', command];
    const proc = await this.driver.spawn(this.sandbox, argv, { cwd, env });
    proc.stdin.end();
    const id = `term_${randomBytes(8).toString('hex')}`;
    const t: Terminal = { proc, out: Buffer.alloc(0), truncated: false, limit, exit: undefined, done: Promise.resolve() };
    const add = (c: Buffer): void => {
      t.out = Buffer.concat([t.out, c]);
      if (t.out.length > t.limit) {
        // Keep the end, cut at a character boundary.
        let cut = t.out.length - t.limit;
        while (cut < t.out.length && ((t.out[cut] ?? 0) & 0xc0) === 0x80) cut += 1;
        t.out = t.out.subarray(cut);
        t.truncated = true;
      }
    };
    proc.stdout.on('data', add);
    proc.stderr.on('data', add);
    const streamsEnded = Promise.all([new Promise((r) => proc.stdout.once('end', r)), new Promise((r) => proc.stderr.once('end', r))]);
    t.done = proc.wait().then(async ({ exitCode, killed }) => {
      await Promise.race([streamsEnded, new Promise((r) => setTimeout(r, 1000).unref())]);
      t.exit = killed ? { exitCode: null, signal: 'SIGKILL' } : { exitCode, signal: null };
    });
    this.all.set(id, t);
    return id;
  }

  private get(id: string): Terminal {
    const t = this.all.get(id);
    if (!t) throw new acp.RequestError(-32602, `no terminal ${id}`);
    return t;
  }

  output(id: string): acp.TerminalOutputResponse {
    const t = this.get(id);
    return { output: t.out.toString('utf8'), truncated: t.truncated, ...(t.exit ? { exitStatus: t.exit } : {}) };
  }

  async waitForExit(id: string): Promise<acp.WaitForTerminalExitResponse> {
    const t = this.get(id);
    await t.done;
    return t.exit ?? { exitCode: null, signal: null };
  }

  async kill(id: string): Promise<void> {
    const t = this.get(id);
    if (!t.exit) await t.proc.kill().catch(() => undefined);
    await t.done;
  }

  async release(id: string): Promise<void> {
    const t = this.all.get(id);
    if (!t) return;
    if (!t.exit) await t.proc.kill().catch(() => undefined);
    this.all.delete(id);
  }

  async closeAll(): Promise<void> {
    await Promise.all([...this.all.keys()].map((id) => this.release(id)));
  }
}
