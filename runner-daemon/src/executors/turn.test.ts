import { randomBytes } from 'node:crypto';
import { createServer } from 'node:http';
import type { AddressInfo } from 'node:net';
import Docker from 'dockerode';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createLogger } from '@agentplane/core';
import type { ModelRequest, ModelStreamEvent } from '@agentplane/protocol';
import type { LeaseHandle, LeaseOffer } from '../agent.js';
import { InfrastructureFailure } from '../failures.js';
import { DockerDriver } from '../sandbox/docker-driver.js';
import { sandboxImageWithout } from '../sandbox/fixtures/images.js';
import { ensureSandboxImage } from '../sandbox/image.js';
import { SandboxManager } from '../sandbox/manager.js';
import { SandboxError } from '../sandbox/types.js';
import type { AgentTool } from '../harness/index.js';
import { offeredTools, turnExecutor } from './turn.js';

/**
 * A sandbox the engine does not start is the machine's failure: the lease fails as
 * `infrastructure` (an `InfrastructureFailure`) and the Run is retried, instead of ending the turn
 * as the agent's work. An Environment this runner cannot serve by its own content stays `work`.
 */
const runnerId = `rturn-${randomBytes(4).toString('hex')}`;
const docker = new Docker();
const log = createLogger({ name: 'turn-test', level: 'silent' });

beforeAll(async () => {
  await ensureSandboxImage({ docker });
}, 120_000);
afterAll(async () => {
  await new DockerDriver({ runnerId, docker }).reapOrphans(runnerId, []);
});

function handleFor(sessionId: string, image: string, network: { network_mode: 'none' | 'allowlist'; allowed_hosts?: string[] } = { network_mode: 'none' }): LeaseHandle {
  const offer: LeaseOffer = {
    lease_id: `lease_${randomBytes(4).toString('hex')}`, attempt: 1, run_id: 'run_t', session_id: sessionId, accept_within_ms: 5000, lease_ttl_ms: 30_000,
    spec: {
      run_id: 'run_t', session_id: sessionId, thread_id: 'sthr_t', agent: { routing_key: 'default', tools: [] },
      environment: { image, resources: { cpu_millis: 1000, memory_mib: 256, disk_mib: 512, max_duration_seconds: 60 }, ...network, retention_mode: 'durable' },
      history: [],
    },
  };
  return {
    lease: { lease_id: offer.lease_id, attempt: 1 }, offer, signal: new AbortController().signal,
    sendEvents: () => undefined,
    deliverEvents: () => Promise.reject(new Error('no events expected')),
    model: { stream: () => { throw new Error('no model step expected'); } },
    checkTool: () => Promise.reject(new Error('no tool expected')),
  };
}

describe('a sandbox that does not start', () => {
  it('fails the lease as infrastructure when the engine is too slow to create it', async () => {
    // The real engine, except that creating a Session's container takes longer than the start bound.
    const late: Promise<unknown>[] = [];
    const slow = new Proxy(docker, {
      get(target, prop, receiver) {
        if (prop !== 'createContainer') return Reflect.get(target, prop, receiver) as unknown;
        return (opts: Docker.ContainerCreateOptions) => {
          const created = (async () => {
            if (opts.name?.includes('-sess_')) await new Promise((r) => setTimeout(r, 3_000));
            return target.createContainer(opts);
          })();
          late.push(created.catch(() => undefined));
          return created;
        };
      },
    });
    const driver = new DockerDriver({ runnerId, docker: slow, startTimeoutMs: 1_500, logger: log });
    const executor = turnExecutor({ sandboxes: new SandboxManager({ driver, runnerId, logger: log }), log, baseUrl: 'http://127.0.0.1:9' });
    const handle = handleFor(`sess_${randomBytes(8).toString('hex')}`, 'agentplane/sandbox:latest');
    const err = await executor.run(handle).then(() => undefined, (e: unknown) => e);
    expect(err).toBeInstanceOf(InfrastructureFailure);
    expect((err as Error).message).toMatch(/did not start within 1500 ms/);
    expect((err as Error).cause).toMatchObject({ name: 'SandboxError', reason: 'start_timeout' });
    // The late creation is removed by the driver once it settles; the workspace volume goes here.
    await Promise.all(late);
    const filters = JSON.stringify({ label: [`agentplane.session=${handle.offer.session_id}`] });
    await expect.poll(async () => (await docker.listContainers({ all: true, filters })).length, { timeout: 30_000, interval: 100 }).toBe(0);
    await driver.destroy(handle.offer.session_id);
  }, 60_000);

  it('stays the Run\'s own failure when its Environment names an image this runner does not have', async () => {
    const driver = new DockerDriver({ runnerId, docker, logger: log });
    const executor = turnExecutor({ sandboxes: new SandboxManager({ driver, runnerId, logger: log }), log, baseUrl: 'http://127.0.0.1:9' });
    const handle = handleFor(`sess_${randomBytes(8).toString('hex')}`, `agentplane/no-such-image:${randomBytes(4).toString('hex')}`);
    const err = await executor.run(handle).then(() => undefined, (e: unknown) => e);
    expect(err).toBeInstanceOf(SandboxError);
    expect(err).toMatchObject({ reason: 'image_missing' });
  }, 60_000);

  it('stays the Run\'s own failure when its allowlist Environment names an image without node for the egress relay', async () => {
    const { image, remove } = await sandboxImageWithout(docker, 'node');
    const driver = new DockerDriver({ runnerId, docker, logger: log });
    const executor = turnExecutor({ sandboxes: new SandboxManager({ driver, runnerId, logger: log }), log, baseUrl: 'http://127.0.0.1:9' });
    const handle = handleFor(`sess_${randomBytes(8).toString('hex')}`, image, { network_mode: 'allowlist', allowed_hosts: ['example.com'] });
    try {
      const err = await executor.run(handle).then(() => undefined, (e: unknown) => e);
      expect(err).not.toBeInstanceOf(InfrastructureFailure);
      expect(err).toMatchObject({ name: 'SandboxError', reason: 'image_unsuitable' });
      expect((err as Error).message).toMatch(/has no `node` on its PATH/);
    } finally {
      await driver.destroy(handle.offer.session_id);
      await remove();
    }
  }, 60_000);
});

const usage = { input_tokens: 1, cached_input_tokens: 0, cache_write_input_tokens: 0, output_tokens: 1, reasoning_output_tokens: 0, total_tokens: 2 };

/**
 * A Run whose model asks for one bash command per step (`commands`), then ends the turn;
 * `beforeStep(i)` runs before step i is answered. Its events are collected in `events`.
 */
function scriptedRun(sessionId: string, commands: string[], beforeStep: (i: number) => Promise<void> = async () => {}, topology: 'split' | 'colocated' = 'split', sandboxId?: string) {
  const events: Array<{ type: string; payload: unknown }> = [];
  const abort = new AbortController();
  const offer: LeaseOffer = {
    lease_id: `lease_${randomBytes(4).toString('hex')}`, attempt: 1, run_id: 'run_t', session_id: sessionId, accept_within_ms: 5000, lease_ttl_ms: 30_000,
    spec: {
      run_id: 'run_t', session_id: sessionId, thread_id: 'sthr_t', agent: { routing_key: 'default', tools: [{ type: 'builtin', name: 'bash' }] },
      environment: {
        image: 'agentplane/sandbox:latest', resources: { cpu_millis: 1000, memory_mib: 256, disk_mib: 512, max_duration_seconds: 60 },
        network_mode: 'none', retention_mode: 'durable', harness_topology: topology,
      },
      history: [{ role: 'user', content: [{ type: 'text', text: 'go' }] }],
      ...(sandboxId ? { sandbox_id: sandboxId } : {}),
    },
  };
  let step = 0;
  const handle: LeaseHandle = {
    lease: { lease_id: offer.lease_id, attempt: 1 }, offer, signal: abort.signal,
    sendEvents: () => undefined,
    deliverEvents: async (_session, batch) => {
      events.push(...batch.map((e) => ({ type: e.type, payload: e.payload })));
      return batch.map((_, i) => events.length - batch.length + i + 1);
    },
    model: {
      async *stream(_request: ModelRequest): AsyncIterable<ModelStreamEvent> {
        const i = step++;
        await beforeStep(i);
        if (i < commands.length) {
          yield { type: 'tool_use', id: `toolu_${i}`, name: 'bash', input: { command: commands[i] } };
          yield { type: 'end', stop_reason: 'tool_use', usage, provider: 'scripted', model: 's' };
        } else {
          yield { type: 'text_delta', text: 'done' };
          yield { type: 'end', stop_reason: 'end_turn', usage, provider: 'scripted', model: 's' };
        }
      },
    },
    checkTool: async () => ({ decision: 'allow', rule_id: null, message: 'ok' }),
  };
  return { handle, events, abort };
}

/**
 * A Session's container removed from outside the runner during a Run (`docker rm -f` by hand,
 * another tool) is the machine's failure: the lease fails as `infrastructure` and the Run is
 * retried, and the retry gets a new container, instead of the turn ending as the agent's work or
 * the model being shown a command "killed" with exit code 137.
 */
describe('a sandbox removed from outside the runner during a Run', () => {
  const setup = () => {
    const driver = new DockerDriver({ runnerId, docker, logger: log });
    const executor = turnExecutor({ sandboxes: new SandboxManager({ driver, runnerId, logger: log }), log, baseUrl: 'http://127.0.0.1:9' });
    return { driver, executor };
  };
  const removeContainer = (driver: DockerDriver, sessionId: string) => docker.getContainer(driver.containerName(sessionId)).remove({ force: true });

  it('between two tool calls fails the lease as infrastructure; the retry runs in a new container', async () => {
    const { driver, executor } = setup();
    const sessionId = `sess_${randomBytes(8).toString('hex')}`;
    const first = scriptedRun(sessionId, ['echo one', 'echo two'], async (i) => {
      if (i === 1) await removeContainer(driver, sessionId);
    });
    const err = await executor.run(first.handle).then(() => undefined, (e: unknown) => e);
    expect(err).toBeInstanceOf(InfrastructureFailure);
    expect((err as Error).message).toMatch(/the sandbox went away during the Run/);
    const retry = scriptedRun(sessionId, ['echo again']);
    await expect(executor.run(retry.handle)).resolves.toMatchObject({ stop_reason: { type: 'end_turn' } });
    expect(retry.events.find((e) => e.type === 'agent.tool_result')?.payload).toMatchObject({ content: expect.stringContaining('again'), exit_code: 0 });
    await driver.destroy(sessionId);
  }, 60_000);

  it('while a command runs fails the lease as infrastructure; the model is not shown the command as killed', async () => {
    const { driver, executor } = setup();
    const sessionId = `sess_${randomBytes(8).toString('hex')}`;
    const run = scriptedRun(sessionId, ['touch /workspace/.started; sleep 60']);
    const result = executor.run(run.handle).then(() => undefined, (e: unknown) => e);
    const started = async (): Promise<boolean> => (await driver.exec(await driver.ensure({ id: sessionId }), ['test', '-e', '/workspace/.started'])).exitCode === 0;
    await expect.poll(() => run.events.some((e) => e.type === 'agent.tool_use') && started(), { timeout: 30_000, interval: 100 }).toBe(true);
    await removeContainer(driver, sessionId);
    const err = await result;
    expect(err).toBeInstanceOf(InfrastructureFailure);
    expect((err as Error).message).toMatch(/removed while the command ran/);
    expect(run.events.filter((e) => e.type === 'agent.tool_result')).toEqual([]);
    await driver.destroy(sessionId);
  }, 60_000);

  it('under a colocated harness fails the lease as infrastructure', async () => {
    const { driver, executor } = setup();
    const sessionId = `sess_${randomBytes(8).toString('hex')}`;
    const run = scriptedRun(sessionId, ['echo one', 'echo two'], async (i) => {
      if (i === 1) await removeContainer(driver, sessionId);
    }, 'colocated');
    const err = await executor.run(run.handle).then(() => undefined, (e: unknown) => e);
    expect(err).toBeInstanceOf(InfrastructureFailure);
    await driver.destroy(sessionId);
  }, 60_000);
});

/**
 * A child thread of a coordinator Session runs in its own sandbox (`sandbox_id`). Its lease lost
 * stops that sandbox's processes, never those of the Session's primary thread (or of another
 * child), whose Runs this runner still holds.
 */
describe('a lost lease of a child thread', () => {
  it('stops the child\'s sandbox; the primary thread\'s command of the same Session runs on', async () => {
    const driver = new DockerDriver({ runnerId, docker, logger: log });
    const executor = turnExecutor({ sandboxes: new SandboxManager({ driver, runnerId, logger: log }), log, baseUrl: 'http://127.0.0.1:9' });
    const sessionId = `sess_${randomBytes(8).toString('hex')}`;
    const childSandbox = `${sessionId}.${randomBytes(12).toString('hex')}`;
    const primary = scriptedRun(sessionId, ['touch /workspace/.started; while [ ! -e /workspace/.go ]; do sleep 0.1; done; echo primary went on']);
    const child = scriptedRun(sessionId, ['touch /workspace/.started; sleep 600 & wait'], undefined, 'split', childSandbox);
    const primaryDone = executor.run(primary.handle);
    const childDone = executor.run(child.handle).then(() => undefined, () => undefined);
    const started = async (id: string): Promise<boolean> => {
      const info = await docker.getContainer(driver.containerName(id)).inspect().catch(() => undefined);
      if (!info?.State.Running) return false;
      return (await driver.exec(await driver.ensure({ id }), ['test', '-e', '/workspace/.started'])).exitCode === 0;
    };
    await expect.poll(async () => (await started(sessionId)) && (await started(childSandbox)), { timeout: 30_000, interval: 100 }).toBe(true);
    // What the runner does with a lost lease: abort its work, then stop its sandbox.
    child.abort.abort(new Error('lease revoked'));
    await executor.leaseLost?.(sessionId, child.handle.lease);
    await childDone;
    expect((await docker.getContainer(driver.containerName(childSandbox)).inspect()).State.Running).toBe(false);
    expect((await docker.getContainer(driver.containerName(sessionId)).inspect()).State.Running).toBe(true);
    const go = await docker.getContainer(driver.containerName(sessionId)).exec({ Cmd: ['touch', '/workspace/.go'] });
    await go.start({});
    await expect(primaryDone).resolves.toMatchObject({ stop_reason: { type: 'end_turn' } });
    expect(primary.events.find((e) => e.type === 'agent.tool_result')?.payload).toMatchObject({ content: expect.stringContaining('primary went on'), exit_code: 0 });
    await driver.destroy(childSandbox);
    await driver.destroy(sessionId);
  }, 60_000);
});

/**
 * An Agent stored before custom tools named `skill` were refused may hold one. A Run that places
 * skills offers the model one tool under that name, the built-in one (the skills prompt tells the
 * model to open skills with it): a request naming a tool twice is refused by providers, which
 * would fail every step of the turn.
 */
describe("an Agent's custom tool named like the built-in skill tool", () => {
  const custom = (name: string): AgentTool => ({ type: 'custom', spec: { name, description: `custom ${name}`, input_schema: { type: 'object' } } });
  const warnings = () => {
    const seen: unknown[] = [];
    return { seen, log: { warn: (o: unknown) => void seen.push(o) } };
  };
  const named = (tools: AgentTool[]) => tools.map((t) => (t.type === 'builtin' ? `builtin:${t.name}` : `${t.type}:${t.spec.name}`));

  it('is left out of a Run with skills for the built-in one, with a warning; kept when the Run has none', () => {
    const w = warnings();
    const tools = [{ type: 'builtin', name: 'bash' }, custom('skill'), custom('lookup')] satisfies AgentTool[];
    expect(named(offeredTools(tools, true, [], w.log))).toEqual(['builtin:bash', 'custom:lookup', 'builtin:skill']);
    expect(w.seen).toEqual([{ tool: 'skill', left_out: 'custom', offered: 'builtin' }]);
    // The Agent naming the built-in itself, after the custom one: the built-in still wins, once.
    const both = [custom('skill'), { type: 'builtin', name: 'skill' }] satisfies AgentTool[];
    expect(named(offeredTools(both, true, [], warnings().log))).toEqual(['builtin:skill']);
    const none = warnings();
    expect(named(offeredTools(tools, false, [], none.log))).toEqual(['builtin:bash', 'custom:skill', 'custom:lookup']);
    expect(none.seen).toEqual([]);
  });

  it('of other tools sharing a name, offers the first (the Agent\'s before an MCP tool)', () => {
    const w = warnings();
    const mcp: AgentTool = { type: 'external', spec: { name: 'ops__deploy', description: 'mcp', input_schema: { type: 'object' } }, call: async () => ({ content: '', is_error: false }) };
    expect(named(offeredTools([custom('ops__deploy'), custom('lookup')], false, [mcp], w.log))).toEqual(['custom:ops__deploy', 'custom:lookup']);
    expect(w.seen).toEqual([{ tool: 'ops__deploy', left_out: 'external', offered: 'custom' }]);
  });

  it('a Run with skills offers one `skill` tool, the built-in, and a use of it opens the skill', async () => {
    const skillBody = `# Review ${randomBytes(4).toString('hex')}`;
    const server = createServer((_req, res) => {
      res.writeHead(200, { 'content-type': 'application/json' });
      res.end(JSON.stringify({ files: [{ path: 'SKILL.md', content_base64: Buffer.from(skillBody).toString('base64') }] }));
    });
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    try {
      const sessionId = `sess_${randomBytes(8).toString('hex')}`;
      const requests: ModelRequest[] = [];
      const events: Array<{ type: string; payload: unknown }> = [];
      const offer: LeaseOffer = {
        lease_id: `lease_${randomBytes(4).toString('hex')}`, attempt: 1, run_id: 'run_t', session_id: sessionId, accept_within_ms: 5000, lease_ttl_ms: 30_000,
        spec: {
          run_id: 'run_t', session_id: sessionId, thread_id: 'sthr_t', agent: { routing_key: 'default', tools: [custom('skill')] },
          environment: { image: 'agentplane/sandbox:latest', resources: { cpu_millis: 1000, memory_mib: 256, disk_mib: 512, max_duration_seconds: 60 }, network_mode: 'none', retention_mode: 'durable' },
          history: [{ role: 'user', content: [{ type: 'text', text: 'go' }] }],
          runtime_files: { bearer: 'runtime-bearer' },
          skills: [{ ref: 'skv_1', name: 'review', description: 'Reviews a change.', mount_path: '.agentplane/skills/review' }],
        },
      };
      const handle: LeaseHandle = {
        lease: { lease_id: offer.lease_id, attempt: 1 }, offer, signal: new AbortController().signal,
        sendEvents: () => undefined,
        deliverEvents: async (_session, batch) => {
          events.push(...batch.map((e) => ({ type: e.type, payload: e.payload })));
          return batch.map((_, i) => events.length - batch.length + i + 1);
        },
        model: {
          async *stream(request: ModelRequest): AsyncIterable<ModelStreamEvent> {
            requests.push(request);
            if (requests.length === 1) {
              yield { type: 'tool_use', id: 'toolu_0', name: 'skill', input: { name: 'review' } };
              yield { type: 'end', stop_reason: 'tool_use', usage, provider: 'scripted', model: 's' };
            } else {
              yield { type: 'text_delta', text: 'done' };
              yield { type: 'end', stop_reason: 'end_turn', usage, provider: 'scripted', model: 's' };
            }
          },
        },
        checkTool: async () => ({ decision: 'allow', rule_id: null, message: 'ok' }),
      };
      const driver = new DockerDriver({ runnerId, docker, logger: log });
      const baseUrl = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
      const executor = turnExecutor({ sandboxes: new SandboxManager({ driver, runnerId, logger: log }), log, baseUrl });
      await expect(executor.run(handle)).resolves.toMatchObject({ stop_reason: { type: 'end_turn' } });
      expect(requests).toHaveLength(2);
      for (const r of requests) {
        const skillTools = (r.tools ?? []).filter((t) => t.name === 'skill');
        expect(skillTools).toHaveLength(1);
        expect(skillTools[0]?.description).not.toBe('custom skill');
      }
      expect(events.find((e) => e.type === 'agent.tool_result')?.payload).toMatchObject({ content: expect.stringContaining(skillBody), is_error: false });
      await driver.destroy(sessionId);
    } finally {
      await new Promise((resolve) => server.close(resolve));
    }
  }, 60_000);
});
