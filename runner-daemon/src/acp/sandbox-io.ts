/**
 * The ACP client methods an agent calls on the runner (`fs/*`, `terminal/*`), served inside the
 * Session's sandbox and confined to its workspace: a path is resolved inside the sandbox
 * (`realpath -m`, symlinks followed) and refused unless it is the workspace or below it, in the
 * same command that then reads or writes it.
 */
import { randomBytes } from 'node:crypto';
import * as acp from '@agentclientprotocol/sdk';
import type { Sandbox, SandboxDriver, SandboxProcess } from '../sandbox/types.js';
import { OutputTail } from '../sandbox/output.js';

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
  // Before the exit code: output cut at the cap may have ended the command.
  if (r.truncated) throw new acp.RequestError(-32602, `${path} is larger than ${MAX_FILE_BYTES} bytes`);
  if (r.exitCode !== 0) throw refused(r.stderr, path);
  return r.stdout;
}

export async function writeConfined(driver: SandboxDriver, sandbox: Sandbox, path: string, content: string): Promise<void> {
  if (Buffer.byteLength(content) > MAX_FILE_BYTES) throw new acp.RequestError(-32602, `the content is larger than ${MAX_FILE_BYTES} bytes`);
  const r = await driver.exec(sandbox, ['bash', '-c', `${CONFINE}\nmkdir -p -- "$(dirname -- "$p")" && cat > "$p"`, 'write', path, sandbox.workspace], {
    stdin: content, timeoutMs: 30_000, maxOutputBytes: 8192,
  });
  if (r.exitCode !== 0) throw refused(r.stderr, path);
}

/**
 * Most output a terminal keeps, whatever `outputByteLimit` the agent asks for: the agent chooses
 * the limit, the runner holds the bytes (per terminal, for as long as the terminal lives).
 */
export const MAX_TERMINAL_OUTPUT_BYTES = 1024 * 1024;

interface Terminal {
  proc: SandboxProcess;
  out: OutputTail;
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

  async create(command: string, args: string[], cwd: string, env: Record<string, string>, limit = MAX_TERMINAL_OUTPUT_BYTES): Promise<string> {
    const argv = args.length > 0 ? [command, ...args] : ['bash', '-c', command];
    const proc = await this.driver.spawn(this.sandbox, argv, { cwd, env });
    proc.stdin.end();
    const id = `term_${randomBytes(8).toString('hex')}`;
    const kept = Number.isFinite(limit) ? Math.min(Math.max(0, Math.floor(limit)), MAX_TERMINAL_OUTPUT_BYTES) : MAX_TERMINAL_OUTPUT_BYTES;
    const t: Terminal = { proc, out: new OutputTail(kept), exit: undefined, done: Promise.resolve() };
    const add = (c: Buffer): void => t.out.add(c);
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
    return { output: t.out.text(), truncated: t.out.truncated, ...(t.exit ? { exitStatus: t.exit } : {}) };
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
