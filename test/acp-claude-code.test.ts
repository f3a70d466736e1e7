import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { ChildProcess } from 'node:child_process';
import type { HttpClient } from '@agentplane/client';
import { startPlatform, waitFor, type Platform } from './harness/platform.js';
import { pairDaemon, startDaemon } from './harness/daemon.js';
import { FAST_LEASES, idleCount, SCRIPT, untilEvents, type Json } from './harness/turns.js';

/**
 * A real third-party agent, `@zed-industries/claude-code-acp`, driven end to end by the `scripted`
 * model through the sandbox's Anthropic-compatible endpoint, inside a `--network none` sandbox.
 * The runner installs the package from the npm registry, so the test runs only when
 * `ACP_REAL_AGENT_SPEC` names it (e.g. `@zed-industries/claude-code-acp@0.16.2`); the turn itself
 * is offline (docs/ACP.md).
 */
const SPEC = process.env.ACP_REAL_AGENT_SPEC;
const NAME = '@zed-industries/claude-code-acp';
let p: Platform;
let api: HttpClient;
let principal: string;
let daemon: ChildProcess | undefined;

describe.skipIf(!SPEC)('a real ACP agent: Claude Code over ACP', () => {
  beforeAll(async () => {
    p = await startPlatform({ runner: false, scheduler: true, env: { ...FAST_LEASES } });
    api = p.root;
    principal = (await api.post<{ id: string }>(`/v1/organizations/workspaces/${p.bootstrap.workspace_id}/principals`, {
      external_subject_id: 'cc-user', principal_type: 'person', display_name: 'CC User',
    })).id;
    const { dir, runnerId } = await pairDaemon(p, principal, 'claude-code');
    daemon = startDaemon(dir, ['--acp-harness', SPEC ?? '']);
    await waitFor('the runner with Claude Code', async () => {
      const r = await api.get<{ data: Array<{ runner: string; status: string; capabilities: { providers: Json[] } }> }>('/v1/runner-pools/presences');
      return r.data.some((x) => x.runner === runnerId && x.status === 'ready' && x.capabilities.providers.some((pr) => JSON.stringify(pr.acp_harnesses ?? []).includes(NAME))) ? true : undefined;
    }, 400_000);
  }, 420_000);
  afterAll(async () => {
    daemon?.kill('SIGKILL');
    await p?.stop();
  });

  it('a turn that writes, reads and edits a workspace file, then runs a command in a terminal', async () => {
    const env = (await api.post<{ id: string }>('/v1/environments', {
      name: 'claude-code', image: 'agentplane/sandbox:latest',
      resources: { cpu_millis: 2000, memory_mib: 1024, disk_mib: 1024, max_duration_seconds: 300 },
      harness: { kind: 'acp', package: NAME, command: 'claude-code-acp' },
    })).id;
    const f = '/workspace/notes.txt';
    const id = (await api.post<{ id: string }>('/v1/sessions', {
      agent: {
        name: 'cc', model: 'default', tools: [], system: SCRIPT([
          { when: { user_contains: 'notes' }, then: [{ tool: 'mcp__acp__Write', input: { file_path: f, content: 'the colour is red\n' } }] },
          { when: { after_tool: 'mcp__acp__Write' }, then: [{ tool: 'mcp__acp__Read', input: { file_path: f } }] },
          { when: { after_tool: 'mcp__acp__Read' }, then: [{ tool: 'mcp__acp__Edit', input: { file_path: f, old_string: 'red', new_string: 'blue' } }] },
          { when: { after_tool: 'mcp__acp__Edit' }, then: [{ tool: 'mcp__acp__Bash', input: { command: `cat ${f}`, description: 'show the file', timeout: 60000 } }] },
          { when: { after_tool: 'mcp__acp__Bash' }, then: [{ reply: 'Now: {{tool_result}}' }] },
          { when: {}, then: [{ reply: 'ok' }] },
        ]),
      },
      environment_id: env,
    })).id;
    await api.post(`/v1/sessions/${id}/events`, { type: 'user.message', payload: { content: 'fix the notes file', authored_by: principal, caused_by: { kind: 'api' } } });
    const evs = await untilEvents(api, id, (e) => idleCount(e) >= 1, 240_000);
    const stop = evs.find((e) => e.type === 'session.status_idle')?.payload.stop_reason;
    expect(stop, JSON.stringify(evs.map((e) => [e.type, e.payload])).slice(-3000)).toMatchObject({ type: 'end_turn' });
    expect(evs.filter((e) => e.type === 'agent.tool_use').map((e) => e.payload.name)).toEqual(['edit', 'read', 'edit', 'bash']);
    expect(JSON.stringify(evs.filter((e) => e.type === 'agent.message').at(-1)?.payload)).toContain('the colour is blue');
  }, 300_000);
});
