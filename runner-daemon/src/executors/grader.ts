import type { Logger } from '@agentplane/core';
import { ZERO_USAGE, type ModelRequest, type TokenUsage } from '@agentplane/protocol';
import type { LeaseHandle } from '../agent.js';
import { HarnessError } from '../harness/events.js';
import type { Sandbox, SandboxDriver } from '../sandbox/types.js';

const REPORT_SYSTEM_BYTES = 96 * 1024;
const REPORT_PROMPT_BYTES = 320 * 1024;
const REPORT_OUTPUT_BYTES = 64 * 1024;
/** At most `max` bytes of UTF-8 (a split character at the end is dropped). */
const cut = (s: string, max: number): string => {
  const b = Buffer.from(s, 'utf8');
  return b.length <= max ? s : b.subarray(0, max).toString('utf8').replace(/\uFFFD$/, '');
};

/** The `grader` part of a grader Run's turn spec (the control plane's `GraderSpec`). */
export interface GraderTurn {
  routing_key: string;
  system: string;
  prompt: string;
  paths: string[];
  limits: { file_bytes: number; files_total_bytes: number };
}

export function isGraderTurn(v: unknown): v is GraderTurn {
  if (!v || typeof v !== 'object') return false;
  const g = v as Record<string, unknown>;
  const limits = g.limits as Record<string, unknown> | undefined;
  return typeof g.routing_key === 'string' && typeof g.system === 'string' && typeof g.prompt === 'string'
    && Array.isArray(g.paths) && g.paths.every((p) => typeof p === 'string') && g.paths.length <= 16
    && !!limits && typeof limits.file_bytes === 'number' && typeof limits.files_total_bytes === 'number';
}

/** Reads the named workspace files, each and all together bounded; a missing file is said to be missing. */
async function namedFiles(driver: SandboxDriver, sandbox: Sandbox, g: GraderTurn, signal: AbortSignal): Promise<string> {
  const parts: string[] = [];
  let left = Math.min(g.limits.files_total_bytes, 1024 * 1024);
  for (const path of g.paths) {
    if (left <= 0 || signal.aborted) break;
    const want = Math.min(g.limits.file_bytes, left);
    const abs = path.startsWith('/') ? path : `${sandbox.workspace.replace(/\/$/, '')}/${path}`;
    const res = await driver.exec(sandbox, ['bash', '-c', '[ -f "$1" ] || exit 3; head -c "$2" -- "$1"', 'grader', abs, String(want + 1)], {
      timeoutMs: 10_000, signal, maxOutputBytes: want + 1024,
    });
    if (res.exitCode === 3) {
      parts.push(`## ${path}\n\n(no such file in the workspace)`);
      continue;
    }
    if (res.exitCode !== 0) {
      parts.push(`## ${path}\n\n(could not be read)`);
      continue;
    }
    const bytes = Buffer.from(res.stdout, 'utf8');
    const cut = bytes.length > want;
    const body = bytes.subarray(0, want).toString('utf8');
    left -= Math.min(bytes.length, want);
    parts.push(`## ${path}\n\n\`\`\`\n${body}${cut ? '\n… [truncated]' : ''}\n\`\`\``);
  }
  return parts.length > 0 ? `\n\n# Workspace files named in the final message\n\n${parts.join('\n\n')}` : '';
}

/**
 * A grader Run: one model step in a context of its own (the grader's instructions and rubric,
 * the outcome, the agent's final message and the workspace files it names), through the same
 * model gateway as any turn (so it is metered on this Run). It emits no Session events: its
 * answer goes back in `lease.complete` (`grader`), where the control plane reads the verdict.
 */
export async function runGrader(
  o: { driver: SandboxDriver; log: Logger },
  handle: LeaseHandle,
  g: GraderTurn,
  sandbox: Sandbox | null,
): Promise<Record<string, unknown>> {
  const files = sandbox && g.paths.length > 0 ? await namedFiles(o.driver, sandbox, g, handle.signal) : '';
  const request: ModelRequest = {
    routing_key: g.routing_key,
    system: g.system,
    messages: [{ role: 'user', content: [{ type: 'text', text: `${g.prompt}${files}` }] }],
    tools: [],
  };
  if (handle.signal.aborted) return { stop_reason: { type: 'interrupted' } };
  let output = '';
  let usage: TokenUsage = { ...ZERO_USAGE };
  let ended = false;
  try {
    for await (const ev of handle.model.stream(request, handle.signal)) {
      if (ev.type === 'text_delta') output += ev.text;
      else if (ev.type === 'error') throw new HarnessError('model_error', `grader model step failed: ${ev.error.type}: ${ev.error.message}`, ev.error);
      else if (ev.type === 'end') {
        usage = ev.usage;
        ended = true;
      }
    }
  } catch (err) {
    if (handle.signal.aborted) return { stop_reason: { type: 'interrupted' } };
    if (err instanceof HarnessError && err.modelError?.type === 'budget.exceeded') return { stop_reason: { type: 'budget_exceeded', message: err.modelError.message } };
    throw err;
  }
  if (handle.signal.aborted || !ended) return { stop_reason: { type: 'interrupted' } };
  // The turn's logger names the Run and the lease already.
  o.log.info({ chars: output.length }, 'grader step done');
  // The report rides on lease.complete: kept well inside the frame limit whatever the files held.
  const text = `${g.prompt}${files}`;
  return {
    stop_reason: { type: 'end_turn' },
    usage,
    grader: {
      input: { system: cut(g.system, REPORT_SYSTEM_BYTES), messages: [{ role: 'user', content: [{ type: 'text', text: cut(text, REPORT_PROMPT_BYTES) }] }] },
      output: cut(output, REPORT_OUTPUT_BYTES),
      usage,
    },
  };
}
