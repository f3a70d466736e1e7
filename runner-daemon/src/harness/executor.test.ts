import { randomBytes } from 'node:crypto';
import Docker from 'dockerode';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { ModelClient, ModelRequest, ModelStreamEvent } from '@agentplane/protocol';
import { DockerDriver } from '../sandbox/docker-driver.js';
import { ensureSandboxImage } from '../sandbox/image.js';
import { SandboxManager } from '../sandbox/manager.js';
import { createTar } from '../sandbox/tar.js';
import type { LeaseHandle } from '../agent.js';
import { createHarnessExecutor, HarnessSpecError, type HarnessLease } from './executor.js';

// The runner's lease handle is accepted as is (checked by the type checker).
export const leaseHandleFits = (handle: LeaseHandle): HarnessLease => handle;

const runnerId = `etest-${randomBytes(4).toString('hex')}`;
const docker = new Docker();
const driver = new DockerDriver({ runnerId, docker });
const manager = new SandboxManager({ driver, runnerId, sweepIntervalMs: 0 });

const end: ModelStreamEvent = {
  type: 'end', stop_reason: 'tool_use', provider: 'scripted', model: 'script-1',
  usage: { input_tokens: 1, cached_input_tokens: 0, cache_write_input_tokens: 0, output_tokens: 1, reasoning_output_tokens: 0, total_tokens: 2 },
};
function scripted(steps: ModelStreamEvent[][]): ModelClient {
  return {
    async *stream(_req: ModelRequest) {
      for (const e of steps.shift() ?? []) yield e;
    },
  };
}

beforeAll(async () => {
  await ensureSandboxImage({ docker });
}, 120_000);
afterAll(async () => {
  await driver.reapOrphans(runnerId, []);
});

describe('harness lease executor', () => {
  it('runs a lease in the session sandbox with its resources and sends keyed events', async () => {
    const sent: Array<{ session: string; producer_key: string; type: string; payload: unknown }> = [];
    const sessionId = `sess_${randomBytes(8).toString('hex')}`;
    const handle: HarnessLease = {
      lease: { lease_id: 'lease_1', attempt: 2 },
      offer: {
        run_id: 'run_1',
        session_id: sessionId,
        spec: {
          agent: { routing_key: 'default', tools: [{ type: 'builtin', name: 'bash' }] },
          environment: { memory_mib: 256 },
          history: [{ role: 'user', content: [{ type: 'text', text: 'count the files' }] }],
          resources: [
            { type: 'repository', id: 'res_r', mount_path: 'repo', tar_base64: createTar([{ type: 'file', path: 'a.txt', data: Buffer.from('a') }]).toString('base64') },
            { type: 'file', id: 'res_f', mount_path: 'b.txt', content_base64: Buffer.from('b').toString('base64') },
          ],
        },
      },
      signal: new AbortController().signal,
      sendEvents: (session, events) => {
        for (const e of events) sent.push({ session, ...e });
      },
    };
    const model = scripted([
      [{ type: 'tool_use', id: 'tu_1', name: 'bash', input: { command: 'cat repo/a.txt b.txt' } }, end],
      [{ type: 'text_delta', text: 'ab' }, { ...end, stop_reason: 'end_turn' }],
    ]);
    const result = await createHarnessExecutor({ sandboxes: manager, modelFor: () => model })(handle);
    expect(result.stop_reason).toEqual({ type: 'end_turn' });
    expect(result.usage.total_tokens).toBe(4);
    expect(sent.map((e) => [e.producer_key, e.type])).toEqual([
      ['lease_1:2:0', 'agent.tool_use'],
      ['lease_1:2:1', 'agent.tool_result'],
      ['lease_1:2:2', 'agent.message'],
      ['lease_1:2:3', 'session.status_idle'],
    ]);
    expect(sent[1]!.payload).toMatchObject({ content: 'ab\n[exit code 0]', is_error: false });
    expect(sent.every((e) => e.session === sessionId)).toBe(true);
    await manager.sessionEnded(sessionId);
  });

  it('rejects a malformed spec with a typed error', async () => {
    const handle: HarnessLease = {
      lease: { lease_id: 'lease_2', attempt: 1 },
      offer: { run_id: 'run_2', session_id: 'sess_bad', spec: { agent: {} } },
      signal: new AbortController().signal,
      sendEvents: () => {},
    };
    await expect(createHarnessExecutor({ sandboxes: manager, modelFor: () => scripted([]) })(handle)).rejects.toBeInstanceOf(HarnessSpecError);
  });
});
