import type { ChildProcess } from 'node:child_process';
import { readFileSync } from 'node:fs';
import Docker from 'dockerode';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { HttpClient } from '@agentplane/client';
import { createPerson, startReadyDaemon } from './harness/daemon.js';
import { startPlatform, waitFor, type Platform } from './harness/platform.js';

/**
 * The `gvisor` tier: a runner claims it only after a canary sandbox ran under runsc, and only a
 * runner that claims it gets a gvisor Environment's Runs. Skipped where dockerd has no runsc
 * runtime (`node docker/gvisor-runtime.mjs` registers it; `.ci/run` does).
 */
const runtimes = await new Docker().info().then((i: { Runtimes?: Record<string, unknown> }) => Object.keys(i.Runtimes ?? {}), () => [] as string[]);
const hasRunsc = runtimes.includes('runsc');

let p: Platform;
let api: HttpClient;
let owner: string;
const daemons: ChildProcess[] = [];
type Json = Record<string, unknown>;
interface Ev { seq: number; type: string; payload: Json }
interface Presence { runner: string; status: string; capabilities: { providers: { id: string; tiers: string[] }[] } }
const SCRIPT = (rules: unknown[]) => `\`\`\`scripted\n${JSON.stringify({ rules })}\n\`\`\``;

beforeAll(async () => {
  if (!hasRunsc) return;
  p = await startPlatform({ runner: false, scheduler: true });
  api = p.root;
  owner = await createPerson(p, 'tier-owner', 'Owner');
}, 90_000);
afterAll(async () => {
  for (const d of daemons) d.kill('SIGKILL');
  await p?.stop();
});

const runner = (label: string, args: string[] = []) => startReadyDaemon<Presence>(p, owner, label, daemons, args, 40_000);

async function events(sessionId: string): Promise<Ev[]> {
  const thread = (await api.get<{ data: { id: string }[] }>(`/v1/sessions/${sessionId}/threads`)).data[0]?.id ?? '';
  return (await api.get<{ data: Ev[] }>(`/v1/sessions/${sessionId}/threads/${thread}/events`, { limit: 1000 })).data;
}

describe.skipIf(!hasRunsc)('the gvisor isolation tier', () => {
  it('is claimed only where verified; a gvisor Run waits for such a runner, then runs under gVisor with every isolation flag', async () => {
    // A runner told to offer runc only neither claims gvisor nor gets the Run.
    const plain = await runner('runc-only', ['--tiers', 'container']);
    expect(plain.presence.capabilities.providers.find((x) => x.id === 'docker')?.tiers).toEqual(['container']);

    const env = await api.post<{ id: string; tier: string }>('/v1/environments', { name: 'gv', image: 'agentplane/sandbox:latest', tier: 'gvisor' });
    expect(env.tier).toBe('gvisor');
    const s = await api.post<{ id: string }>('/v1/sessions', {
      agent: {
        name: 'a', model: 'default', tools: [{ type: 'builtin', name: 'bash' }],
        system: SCRIPT([
          { when: { user_contains: 'go' }, then: [{ tool: 'bash', input: { command: 'cat /proc/version; echo uid=$(id -u); touch /probe 2>/dev/null && echo rootfs=rw || echo rootfs=ro; ls /sys/class/net 2>/dev/null | tr "\\n" " "; echo' } }] },
          { when: { on: 'tool_result' }, then: [{ reply: 'result: {{tool_result}}' }] },
        ]),
      },
      environment_id: env.id,
    });
    await api.post(`/v1/sessions/${s.id}/events`, { type: 'user.message', payload: { content: 'go', authored_by: owner, caused_by: { kind: 'api' } } });
    const waiting = await waitFor('the Run waiting with its reason', async () => {
      const r = (await api.get<{ data: { status: string; waiting_reason?: string | null }[] }>(`/v1/sessions/${s.id}/runs`)).data[0];
      return r?.status === 'waiting' && r.waiting_reason?.includes('gvisor') ? r : undefined;
    }, 30_000);
    expect(waiting.waiting_reason).toContain("tier 'gvisor' not offered");

    const gv = await runner('with-gvisor');
    expect(gv.presence.capabilities.providers.find((x) => x.id === 'docker')?.tiers).toEqual(expect.arrayContaining(['container', 'gvisor']));
    const evs = await waitFor('the turn to end', async () => {
      const e = await events(s.id);
      return e.some((x) => x.type === 'session.status_idle') ? e : undefined;
    }, 90_000);
    const text = JSON.stringify(evs.filter((e) => e.type === 'agent.message'));
    // gVisor's own kernel, not the host's.
    const host = readFileSync('/proc/version', 'utf8').trim().slice(0, 40);
    expect(text).toContain('Linux version');
    expect(text).not.toContain(host);
    expect(text).toContain('uid=10001');
    expect(text).toContain('rootfs=ro');
    expect(text).not.toMatch(/eth0/);
    const [run] = (await api.get<{ data: { status: string; attempts: { runner_id: string }[] }[] }>(`/v1/sessions/${s.id}/runs`)).data;
    expect(run?.status).toBe('succeeded');
    expect(run?.attempts.map((a) => a.runner_id)).toEqual([gv.runnerId]);
    // The sandbox really runs under runsc.
    const [box] = await new Docker().listContainers({ filters: JSON.stringify({ label: [`agentplane.session=${s.id}`] }) });
    expect(box).toBeDefined();
    const inspected = await new Docker().getContainer(box!.Id).inspect();
    expect(inspected.HostConfig.Runtime).toBe('runsc');
    expect(inspected.HostConfig.NetworkMode).toBe('none');
  }, 180_000);
});
