import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { HttpClient } from '@agentplane/client';
import { startPlatform, type Platform } from './harness/platform.js';
import { developerWorkspace } from './harness/turns.js';
import { errType } from './harness/governance.js';

/**
 * An Environment's (and a SandboxProfile's) `image` is a container image reference as the engine
 * reads it (`[registry[:port]/]path[:tag][@digest]`): one the engine would refuse as malformed is
 * 400 when it is written, not a Run whose sandbox can never start (the engine's refusal reads as
 * the runner's own failure, and the Run is retried for nothing).
 */
let p: Platform;
let api: HttpClient;
let ws: string;

const INVALID = ['a::b', 'a@@b', 'sandbox:', 'agentplane//sandbox', 'agentplane/sandbox:latest:2', 'my_img__', 'sandbox-', 'a/b@sha256:xyz', 'Upper/case'];
const VALID = [
  'agentplane/sandbox:latest', 'debian:bookworm', 'node:20-Slim', 'registry.example.com:5000/team/tool:v1.2_3',
  'localhost:5000/x', `ghcr.io/org/img@sha256:${'a'.repeat(64)}`, `img:1@sha256:${'b'.repeat(64)}`, 'my_img__x', 'a--b',
];

beforeAll(async () => {
  p = await startPlatform();
  ({ api } = await developerWorkspace(p, 'environments-image'));
  ws = p.bootstrap.workspace_id;
}, 120_000);
afterAll(async () => {
  await p?.stop();
});

describe('image references', () => {
  it('refuses a reference the engine would refuse, on every write that takes one', async () => {
    const env = await api.post<{ id: string; version: number }>('/v1/environments', { name: 'ok', image: 'agentplane/sandbox:latest' });
    const sprof = await p.root.post<{ id: string }>(`/v1/organizations/workspaces/${ws}/sandbox-profiles`, { key: 'img-ok', image: 'agentplane/sandbox:latest' });
    for (const image of INVALID) {
      const writes = [
        await api.request('POST', '/v1/environments', { body: { name: 'bad', image } }),
        await api.request('POST', `/v1/environments/${env.id}`, { body: { expected_version: env.version, image } }),
        await p.root.request('POST', `/v1/organizations/workspaces/${ws}/sandbox-profiles`, { body: { key: 'img-bad', image } }),
        await p.root.request('POST', `/v1/sandbox-profiles/${sprof.id}/revisions`, { body: { expected_revision_number: 1, image } }),
      ];
      expect(writes.map((r) => [r.status, errType(r)]), image).toEqual(Array.from({ length: 4 }, () => [400, 'validation.malformed']));
    }
  });

  it('takes every well-formed reference: registry and port, tag, digest', async () => {
    for (const image of VALID) {
      const r = await api.request<{ image: string }>('POST', '/v1/environments', { body: { name: 'fine', image } });
      expect([r.status, r.body.image], image).toEqual([201, image]);
    }
  });
});

describe('allowed hosts', () => {
  it('takes a port from 1 to 65535 written in digits, and refuses any other', async () => {
    const allowlist = (host: string) => ({ name: 'net', image: 'agentplane/sandbox:latest', network: { mode: 'allowlist', allowed_hosts: [host] } });
    for (const host of ['x.com:99999', 'x.com:0', 'x.com:65536', 'x.com:00443', 'x.com:', 'x.com:-1']) {
      const r = await api.request('POST', '/v1/environments', { body: allowlist(host) });
      expect([r.status, errType(r)], host).toEqual([400, 'validation.malformed']);
    }
    for (const host of ['x.com', 'x.com:1', 'x.com:443', 'x.com:8080', '*.x.com:65535']) {
      const r = await api.request('POST', '/v1/environments', { body: allowlist(host) });
      expect(r.status, host).toBe(201);
    }
  });
});
