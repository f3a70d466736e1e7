import { execFileSync } from 'node:child_process';
import { mkdirSync, mkdtempSync, rmSync, writeFileSync, chmodSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { HttpClient } from '@agentplane/client';
import type { Platform } from './harness/platform.js';
import { idleCount, SCRIPT, startTurnPlatform, untilEvents, type Json, type TurnPlatform } from './harness/turns.js';
import { errType } from './harness/governance.js';

/**
 * Skills: JSON and tar publishing as immutable versions, the contract's limits (tar bombs
 * included), Agent selections, and a Run that places its skills read-only in the sandbox and
 * names them to the model, which opens one with the `skill` tool.
 */
const MiB = 1024 * 1024;
let t: TurnPlatform;
let p: Platform;
let api: HttpClient;

beforeAll(async () => {
  t = await startTurnPlatform({ name: 'skills' });
  ({ p, api } = t);
}, 180_000);
afterAll(async () => {
  await p?.stop();
});

const skillMd = (name: string, description: string, body = 'Do the thing carefully.\n') => `---\nname: ${name}\ndescription: ${description}\n---\n\n${body}`;
const text = (path: string, content: string, executable?: boolean) => ({ path, content, ...(executable ? { executable } : {}) });

interface Version { version: number; name: string; description: string; content_sha256: string; files: { path: string; size_bytes: number; executable: boolean }[]; origin: string }
interface Skill { id: string; name: string; latest_version: number; archived_at: string | null; latest: Version }

/** A tar member as a test wants it, including what a well-behaved archiver would never write. */
interface Member { name: string; data?: Buffer; type?: '0' | '2' | '1' | '5' | '3'; link?: string; mode?: number; size?: number }

function header(m: Member): Buffer {
  const h = Buffer.alloc(512, 0);
  h.write(m.name, 0, 100, 'utf8');
  h.write(`${(m.mode ?? 0o644).toString(8).padStart(7, '0')}\0`, 100, 8, 'ascii');
  h.write('0000000\0', 108, 8, 'ascii');
  h.write('0000000\0', 116, 8, 'ascii');
  h.write(`${(m.size ?? m.data?.length ?? 0).toString(8).padStart(11, '0')}\0`, 124, 12, 'ascii');
  h.write('00000000000\0', 136, 12, 'ascii');
  h.write('        ', 148, 8, 'ascii');
  h.write(m.type ?? '0', 156, 1, 'ascii');
  if (m.link) h.write(m.link, 157, 100, 'utf8');
  h.write('ustar\0', 257, 6, 'ascii');
  h.write('00', 263, 2, 'ascii');
  let sum = 0;
  for (const b of h) sum += b;
  h.write(`${sum.toString(8).padStart(6, '0')}\0 `, 148, 8, 'ascii');
  return h;
}

function tarOf(members: Member[], end = true): Buffer {
  const parts: Buffer[] = [];
  for (const m of members) {
    parts.push(header(m));
    if (m.data && m.data.length > 0) {
      parts.push(m.data);
      const rest = m.data.length % 512;
      if (rest) parts.push(Buffer.alloc(512 - rest));
    }
  }
  if (end) parts.push(Buffer.alloc(1024));
  return Buffer.concat(parts);
}

async function importTar(body: Buffer, contentType = 'application/x-tar'): Promise<{ status: number; body: Json }> {
  const res = await fetch(`${p.baseUrl}/v1/skills/import`, { method: 'POST', headers: { ...api.headers(), 'content-type': contentType }, body });
  return { status: res.status, body: (await res.json()) as Json };
}

/** `"system_contains": "X…"` → the same string with its first character as a `\u` escape (identical once parsed). */
const hideConditions = (script: string) => script.replace(/("system_contains":")(.)/g, (_, k: string, c: string) => `${k}\\u${c.charCodeAt(0).toString(16).padStart(4, '0')}`);

const md = (name: string, desc = 'A test skill.') => ({ name: 'SKILL.md', data: Buffer.from(skillMd(name, desc)) });

/** One turn of an Agent that selects `greeter` v1: it opens the skill, then reads and tries to change its files. */
async function greetWithSkill(environmentId: string): Promise<void> {
  const agent = await api.post<{ id: string; skills: Json[] }>('/v1/agents', {
    name: 'greeting-agent', model: 'default', tools: [{ type: 'builtin', name: 'bash' }],
    skills: [{ name: 'greeter', version: 1 }],
    // The conditions are written with a JSON escape, so the script's own text never matches them.
    system: hideConditions(SCRIPT([
      // Progressive disclosure: the body is never in the prompt; the name and description are.
      { when: { system_contains: 'HOWDY-4471' }, then: [{ reply: 'BODY-IN-PROMPT' }] },
      { when: { user_contains: 'hello', system_contains: '- greeter: Greets people in the house style.' }, then: [{ tool: 'skill', input: { name: 'greeter' } }] },
      {
        when: { after_tool: 'skill' },
        then: [{ tool: 'bash', input: { command: 'cat .agentplane/skills/greeter/notes/style.txt; echo tamper >> .agentplane/skills/greeter/SKILL.md 2>/dev/null && echo WRITABLE || echo READONLY; ls .agentplane/skills' } }],
      },
      { when: { after_tool: 'bash' }, then: [{ reply: 'Greeted.' }] },
    ])),
  });
  expect(agent.skills).toEqual([{ name: 'greeter', version: 1 }]);
  const s = await api.post<{ id: string }>('/v1/sessions', { agent: agent.id, environment_id: environmentId });
  await api.post(`/v1/sessions/${s.id}/events`, t.msg('hello there'));
  const events = await untilEvents(api, s.id, (e) => idleCount(e) >= 1, 120_000);
  expect(events.find((e) => e.type === 'session.status_idle')?.payload.stop_reason).toMatchObject({ type: 'end_turn' });
  expect(events.filter((e) => e.type === 'agent.tool_use').map((e) => e.payload.name)).toEqual(['skill', 'bash']);
  const results = events.filter((e) => e.type === 'agent.tool_result').map((e) => String(e.payload.content));
  // The pinned version 1: its body, opened on demand.
  expect(results[0]).toContain('HOWDY-4471');
  expect(results[0]).not.toContain('HELLO-2');
  expect(results[1]).toContain('style-notes-9913');
  expect(results[1]).toContain('READONLY');
  expect(results[1]).toContain('greeter');
  expect(JSON.stringify(events)).not.toContain('BODY-IN-PROMPT');
}

describe('Skills (REST)', () => {
  it('publishes immutable versions from JSON, lists, reads and archives them', async () => {
    const first = await api.request<Skill>('POST', '/v1/skills', {
      body: { files: [text('SKILL.md', skillMd('csv-report', 'Write CSV reports.')), text('templates/report.csv', 'a,b\n'), text('bin/check.sh', '#!/bin/sh\necho ok\n', true)] },
    });
    expect(first.status).toBe(201);
    expect(first.body.id).toMatch(/^skill_[0-9a-f]{32}$/);
    expect(first.body).toMatchObject({ name: 'csv-report', latest_version: 1, archived_at: null });
    expect(first.body.latest).toMatchObject({ version: 1, origin: 'api', description: 'Write CSV reports.' });
    expect(first.body.latest.content_sha256).toMatch(/^sha256:[0-9a-f]{64}$/);
    expect(first.body.latest.files.map((f) => f.path)).toEqual(['SKILL.md', 'bin/check.sh', 'templates/report.csv']);
    expect(first.body.latest.files.find((f) => f.path === 'bin/check.sh')?.executable).toBe(true);

    const second = await api.request<Skill>('POST', '/v1/skills', {
      body: { files: [text('SKILL.md', skillMd('csv-report', 'Write CSV reports, v2.')), { path: 'data.bin', content_base64: Buffer.from([0, 1, 2]).toString('base64') }] },
    });
    expect(second.status).toBe(201);
    expect(second.body.id).toBe(first.body.id);
    expect(second.body.latest.version).toBe(2);
    expect(second.body.latest.content_sha256).not.toBe(first.body.latest.content_sha256);
    // Version 1 never changes.
    const v1 = await api.get<Version>(`/v1/skills/${first.body.id}/versions/1`);
    expect(v1.content_sha256).toBe(first.body.latest.content_sha256);
    expect(v1.files).toHaveLength(3);
    const files = await api.get<{ files: { path: string; content_base64: string }[] }>(`/v1/skills/${first.body.id}/versions/2/files`);
    expect(files.files.find((f) => f.path === 'data.bin')?.content_base64).toBe('AAEC');
    expect((await api.request('GET', `/v1/skills/${first.body.id}/versions/3`)).status).toBe(404);

    const got = await api.get<Skill>(`/v1/skills/${first.body.id}`);
    expect(got).toMatchObject({ latest_version: 2, description: 'Write CSV reports, v2.' });
    const list = await api.get<{ data: Skill[] }>('/v1/skills?limit=100');
    expect(list.data.map((s) => s.id)).toContain(first.body.id);

    const archived = await api.request<Skill>('POST', `/v1/skills/${first.body.id}/archive`);
    expect(archived.status).toBe(200);
    expect(archived.body.archived_at).not.toBeNull();
    expect((await api.get<{ data: Skill[] }>('/v1/skills?limit=100')).data.map((s) => s.id)).not.toContain(first.body.id);
    expect((await api.get<{ data: Skill[] }>('/v1/skills?limit=100&include_archived=true')).data.map((s) => s.id)).toContain(first.body.id);
    // An archived skill cannot be newly selected.
    const agent = await api.request('POST', '/v1/agents', { body: { name: 'a', model: 'default', skills: [{ name: 'csv-report', version: 1 }] } });
    expect(agent.status).toBe(404);
    expect(errType(agent)).toBe('validation.not_found');
  });

  it('imports a tar archive made by tar(1); the digest does not depend on how the files arrived', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'skill-'));
    try {
      mkdirSync(join(dir, 'pdf-tools', 'scripts'), { recursive: true });
      writeFileSync(join(dir, 'pdf-tools', 'SKILL.md'), skillMd('pdf-tools', 'Fill PDF forms.'));
      writeFileSync(join(dir, 'pdf-tools', 'scripts', 'fill.py'), 'print("fill")\n');
      chmodSync(join(dir, 'pdf-tools', 'scripts', 'fill.py'), 0o755);
      const archive = execFileSync('tar', ['-C', dir, '-cf', '-', 'pdf-tools']);
      const imported = await importTar(archive);
      expect(imported.status).toBe(201);
      const skill = imported.body as unknown as Skill;
      expect(skill).toMatchObject({ name: 'pdf-tools', latest_version: 1 });
      expect(skill.latest.origin).toBe('import');
      expect(skill.latest.files.map((f) => [f.path, f.executable])).toEqual([['SKILL.md', false], ['scripts/fill.py', true]]);
      const same = await api.request<Skill>('POST', '/v1/skills', {
        body: { files: [text('SKILL.md', skillMd('pdf-tools', 'Fill PDF forms.')), text('scripts/fill.py', 'print("fill")\n', true)] },
      });
      expect(same.body.latest.version).toBe(2);
      expect(same.body.latest.content_sha256).toBe(skill.latest.content_sha256);
      // `./` archives work too.
      const dot = await importTar(execFileSync('tar', ['-C', join(dir, 'pdf-tools'), '-cf', '-', '.']));
      expect(dot.status).toBe(201);
      expect((dot.body as unknown as Skill).latest.content_sha256).toBe(skill.latest.content_sha256);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });

  it('refuses every limit and every tar bomb with 400 validation.malformed', async () => {
    const cases: Array<[string, Buffer]> = [
      ['too many files', tarOf([md('many'), ...Array.from({ length: 256 }, (_, i) => ({ name: `f/${i}.txt`, data: Buffer.from('x') }))])],
      ['a file of 1 MiB + 1', tarOf([md('big'), { name: 'big.bin', data: Buffer.alloc(MiB + 1, 1) }])],
      ['more than 2 MiB across files', tarOf([md('wide'), { name: 'a.bin', data: Buffer.alloc(MiB, 1) }, { name: 'b.bin', data: Buffer.alloc(MiB, 2) }, { name: 'c.bin', data: Buffer.alloc(10, 3) }])],
      ['a path escaping the directory', tarOf([md('escape'), { name: '../evil.sh', data: Buffer.from('x') }])],
      ['a nested escaping path', tarOf([md('escape2'), { name: 'a/../../evil.sh', data: Buffer.from('x') }])],
      ['an absolute path', tarOf([md('abs'), { name: '/etc/evil', data: Buffer.from('x') }])],
      ['a symbolic link', tarOf([md('link'), { name: 'passwd', type: '2', link: '/etc/passwd' }])],
      ['a hard link', tarOf([md('hard'), { name: 'copy', type: '1', link: 'SKILL.md' }])],
      ['a device', tarOf([md('dev'), { name: 'tty', type: '3' }])],
      ['a truncated archive', tarOf([md('cut'), { name: 'x.txt', data: Buffer.alloc(2000, 1) }], false).subarray(0, 1536)],
      ['not a tar', Buffer.from('hello, this is not an archive'.repeat(40))],
      ['no SKILL.md', tarOf([{ name: 'README.md', data: Buffer.from('hi') }])],
      ['SKILL.md without front matter', tarOf([{ name: 'SKILL.md', data: Buffer.from('just text') }])],
      ['a bad skill name', tarOf([{ name: 'SKILL.md', data: Buffer.from(skillMd('Bad Name', 'x')) }])],
    ];
    for (const [what, body] of cases) {
      const r = await importTar(body);
      expect({ what, status: r.status, type: (r.body.error as Json | undefined)?.type }).toEqual({ what, status: 400, type: 'validation.malformed' });
    }
    // A header announcing an oversize member is refused before its content arrives: the 1 MiB + 1 member is declared but never sent.
    const declared = await importTar(Buffer.concat([header(md('declared')), md('declared').data, Buffer.alloc(512 - (md('declared').data.length % 512)), header({ name: 'huge.bin', size: MiB + 1 })]));
    expect(declared.status).toBe(400);
    // The archive itself: at most 4 MiB.
    const huge = await importTar(Buffer.alloc(4 * MiB + 512, 0));
    expect(huge.status).toBe(400);
    expect((huge.body.error as Json).type).toBe('validation.malformed');
    const wrongType = await importTar(tarOf([md('typed')]), 'application/octet-stream');
    expect(wrongType.status).toBe(400);
    // Nothing of the refused imports was published.
    const names = (await api.get<{ data: Skill[] }>('/v1/skills?limit=100&include_archived=true')).data.map((s) => s.name);
    for (const n of ['many', 'big', 'wide', 'escape', 'abs', 'link', 'hard', 'dev', 'cut', 'declared', 'typed']) expect(names).not.toContain(n);

    // The JSON route has the same limits.
    const json = async (files: unknown[]) => api.request('POST', '/v1/skills', { body: { files } });
    const skill = text('SKILL.md', skillMd('json-limits', 'x'));
    for (const files of [
      [skill, ...Array.from({ length: 256 }, (_, i) => text(`f${i}`, 'x'))],
      [skill, { path: 'big', content_base64: Buffer.alloc(MiB + 1).toString('base64') }],
      [skill, { path: 'a', content_base64: Buffer.alloc(MiB).toString('base64') }, { path: 'b', content_base64: Buffer.alloc(MiB).toString('base64') }, text('c', 'x')],
      [skill, text('../up', 'x')],
      [skill, text('/abs', 'x')],
      [skill, text('a', 'x'), text('a/b', 'y')],
      [text('SKILL.md', `---\nname: huge\ndescription: x\n---\n${'y'.repeat(MiB)}`)],
      [skill, text('dup', 'x'), text('dup', 'y')],
    ]) {
      const r = await json(files);
      expect(r.status).toBe(400);
      expect(errType(r)).toBe('validation.malformed');
    }
  });

  it('places an Agent\'s selected skills read-only in the sandbox (split and colocated); the model sees name and description, and opens the body with the skill tool', async () => {
    await api.post('/v1/skills', {
      files: [text('SKILL.md', skillMd('greeter', 'Greets people in the house style.', 'Always greet with: HOWDY-4471.\nSee notes/style.txt.\n')), text('notes/style.txt', 'style-notes-9913\n')],
    });
    const v2 = await api.post<Skill>('/v1/skills', { files: [text('SKILL.md', skillMd('greeter', 'Version two.', 'Say HELLO-2.\n'))] });
    expect(v2.latest.version).toBe(2);
    const bad = await api.request('POST', '/v1/agents', { body: { name: 'x', model: 'default', skills: [{ name: 'greeter', version: 3 }] } });
    expect(bad.status).toBe(404);
    const colocated = await api.post<{ id: string }>('/v1/environments', {
      name: 'colocated', image: 'agentplane/sandbox:latest', harness_topology: 'colocated',
      resources: { cpu_millis: 1000, memory_mib: 256, disk_mib: 512, max_duration_seconds: 120 },
    });
    for (const envId of [t.envId, colocated.id]) await greetWithSkill(envId);
  });

  it('an AgentDeployment revision selects skills by id and revision; its Sessions\' Runs place them', async () => {
    const ws = p.bootstrap.workspace_id;
    const k = await p.root.post<{ secret: string }>(`/v1/organizations/${p.bootstrap.organization_id}/api-keys`, {
      display_name: 'admin', role: 'admin', scope: { type: 'workspace', workspace_id: ws },
    }, { idempotencyKey: 'skills-admin-key' });
    const admin = new HttpClient({ baseUrl: p.baseUrl, token: k.secret });
    const greeter = (await api.get<{ data: Skill[] }>('/v1/skills?limit=100')).data.find((x) => x.name === 'greeter');
    expect(greeter).toBeDefined();
    const hprof = (await admin.post<{ id: string }>(`/v1/organizations/workspaces/${ws}/harness-profiles`, { key: 'skills-h', kind: 'builtin' })).id;
    const sprof = (await admin.post<{ id: string }>(`/v1/organizations/workspaces/${ws}/sandbox-profiles`, {
      key: 'skills-s', image: 'agentplane/sandbox:latest', resources: { cpu_millis: 1000, memory_mib: 256, disk_mib: 512, max_duration_seconds: 120 },
    })).id;
    const mrp = (await admin.get<{ data: { id: string }[] }>(`/v1/organizations/workspaces/${ws}/model-routing-profiles`, { key: 'default' })).data[0]?.id;
    const agentId = (await api.post<{ id: string }>('/v1/agents', {
      name: 'deployed-greeter', model: 'default',
      system: SCRIPT([{ when: { user_contains: 'hello' }, then: [{ tool: 'skill', input: { name: 'greeter' } }] }, { when: { after_tool: 'skill' }, then: [{ reply: 'Greeted: {{tool_result}}' }] }]),
    })).id;
    const head = await admin.post<{ id: string }>(`/v1/organizations/workspaces/${ws}/agent-deployments`, { agent_id: agentId, key: 'skills-deployment' });
    const revision = (selections: Json[]) => ({
      expected_resource_version: 1, agent_release_number: 1, model_routing: { model_routing_profile_id: mrp, model_routing_profile_revision_number: 1 },
      execution_target: { type: 'managed', harness_profile_id: hprof, harness_profile_revision_number: 1, sandbox_profile_id: sprof, sandbox_profile_revision_number: 1, runner_pool_id: null, harness_topology: 'split' },
      skill_selections: selections, connection_binding_selections: [],
    });
    const unknown = await admin.request('POST', `/v1/agent-deployments/${head.id}/revisions`, { body: revision([{ skill_id: `skill_${'0'.repeat(32)}`, skill_revision_number: 1 }]) });
    expect(unknown.status).toBe(404);
    const noVersion = await admin.request('POST', `/v1/agent-deployments/${head.id}/revisions`, { body: revision([{ skill_id: greeter?.id, skill_revision_number: 9 }]) });
    expect(noVersion.status).toBe(404);
    const published = await admin.request('POST', `/v1/agent-deployments/${head.id}/revisions`, { body: revision([{ skill_id: greeter?.id, skill_revision_number: 1 }]) });
    expect(published.status).toBe(201);
    const s = await api.post<{ id: string; agent: { skills?: Json[] } }>(`/v1/agent-deployments/${head.id}/sessions`, {});
    expect(s.agent.skills).toEqual([{ name: 'greeter', version: 1 }]);
    await api.post(`/v1/sessions/${s.id}/events`, t.msg('hello'));
    const events = await untilEvents(api, s.id, (e) => idleCount(e) >= 1, 120_000);
    expect(events.filter((e) => e.type === 'agent.tool_result').map((e) => String(e.payload.content)).join('')).toContain('HOWDY-4471');
  });
});
