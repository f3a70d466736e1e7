import { once } from 'node:events';
import { PassThrough } from 'node:stream';
import { afterEach, describe, expect, it, vi } from 'vitest';
import type { Sandbox, SandboxDriver, SandboxProcess } from '../sandbox/types.js';
import { MAX_TERMINAL_OUTPUT_BYTES, Terminals } from './sandbox-io.js';

const sandbox: Sandbox = { sessionId: 'sess_1', driver: 'process', ref: '/w', workspace: '/w', createdAt: 0, reused: false };

/** A driver whose one command writes what the test feeds it and exits 0 once its output ends. */
function feeding(): { driver: SandboxDriver; stdout: PassThrough; stderr: PassThrough } {
  const stdout = new PassThrough();
  const stderr = new PassThrough();
  const ended = Promise.all([once(stdout, 'end'), once(stderr, 'end')]).then(() => ({ exitCode: 0, killed: false }));
  const proc: SandboxProcess = { stdin: new PassThrough(), stdout, stderr, wait: () => ended, kill: async () => {} };
  const driver = { spawn: async () => proc } as unknown as SandboxDriver;
  return { driver, stdout, stderr };
}

afterEach(() => {
  vi.restoreAllMocks();
});

describe('ACP terminals', () => {
  it('keeps at most the documented maximum whatever limit the agent asks for, and the end of the output', async () => {
    const { driver, stdout, stderr } = feeding();
    const terminals = new Terminals(driver, sandbox);
    const id = await terminals.create('yes', [], '/w', {}, 100 * MAX_TERMINAL_OUTPUT_BYTES);
    const concat = vi.spyOn(Buffer, 'concat');
    const chunk = Buffer.alloc(4096, 'a');
    for (let i = 0; i < 1024; i++) stdout.write(chunk); // 4 MiB
    stdout.end('the end');
    stderr.end();
    expect(await terminals.waitForExit(id)).toEqual({ exitCode: 0, signal: null });
    const { output, truncated } = terminals.output(id);
    expect(truncated).toBe(true);
    expect(output.length).toBe(MAX_TERMINAL_OUTPUT_BYTES);
    expect(output.endsWith('aaathe end')).toBe(true);
    // Linear: the kept output is joined once, when it is read, never per chunk.
    const joined = concat.mock.calls.reduce((n, [list]) => n + list.reduce((m, b) => m + b.length, 0), 0);
    expect(joined).toBeLessThanOrEqual(MAX_TERMINAL_OUTPUT_BYTES);
  });

  it('cuts the kept end at a character boundary', async () => {
    const { driver, stdout, stderr } = feeding();
    const terminals = new Terminals(driver, sandbox);
    const id = await terminals.create('cmd', [], '/w', {}, 4);
    stdout.write(Buffer.from('xxxxé'));
    stdout.end(Buffer.from('abc'));
    stderr.end();
    await terminals.waitForExit(id);
    // The last 4 bytes start inside "é": that byte goes too.
    expect(terminals.output(id)).toMatchObject({ output: 'abc', truncated: true });
  });
});
