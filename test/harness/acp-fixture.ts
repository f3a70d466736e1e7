/**
 * The fixture ACP agent (test/fixtures/acp-agent/agent.ts) as an installable npm package: bundled
 * with the SDK into one file by esbuild, packed with `npm pack` into a tarball that a runner
 * installs offline (`--acp-harness <tarball>`), like any ACP harness from a registry.
 */
import { execFileSync, type ChildProcess } from 'node:child_process';
import { mkdirSync, mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { build } from 'esbuild';
import type { HttpClient } from '@agentplane/client';
import { pairDaemon, startDaemon } from './daemon.js';
import { ROOT_DIR, startPlatform, waitFor, type Platform } from './platform.js';
import { FAST_LEASES, type Json } from './turns.js';

export const FIXTURE_PACKAGE = 'agentplane-acp-fixture';
export const FIXTURE_COMMAND = 'acp-fixture';

export async function packFixtureAgent(): Promise<string> {
  const dir = mkdtempSync(join(tmpdir(), 'acp-fixture-'));
  const pkg = join(dir, 'pkg');
  mkdirSync(pkg);
  await build({
    entryPoints: [join(ROOT_DIR, 'test/fixtures/acp-agent/agent.ts')],
    outfile: join(pkg, 'agent.mjs'),
    bundle: true, platform: 'node', format: 'esm', target: 'node20', logLevel: 'warning',
    banner: { js: "#!/usr/bin/env node\nimport { createRequire as __cr } from 'node:module'; const require = __cr(import.meta.url);" },
  });
  writeFileSync(join(pkg, 'package.json'), JSON.stringify({ name: FIXTURE_PACKAGE, version: '1.0.0', type: 'module', bin: { [FIXTURE_COMMAND]: 'agent.mjs' } }, null, 2));
  const out = execFileSync('npm', ['pack', '--silent', '--pack-destination', dir], { cwd: pkg, encoding: 'utf8', stdio: ['ignore', 'pipe', 'ignore'] }).trim().split('\n').at(-1) ?? '';
  return join(dir, out);
}

/** A platform (fast leases, no built-in runner) with a person Principal and an Environment running the fixture agent over ACP. */
export interface AcpPlatform {
  p: Platform;
  api: HttpClient;
  principal: string;
  envId: string;
  /** The runners started by `daemon`, by runner id. */
  daemons: Map<string, ChildProcess>;
  /** Pairs a runner for the Principal and starts it with the fixture harness; returns its id. */
  daemon(label: string): Promise<string>;
  /** Waits until every one of these runners is ready with an ACP harness installed. */
  ready(ids: string[]): Promise<void>;
  /** Kills the runners still running and stops the platform. */
  stop(): Promise<void>;
}

export async function startAcpPlatform(): Promise<AcpPlatform> {
  const tarball = await packFixtureAgent();
  // Its MCP upstreams listen on loopback: reachable in development mode only (the outbound address guard).
  const p = await startPlatform({ runner: false, scheduler: true, env: { ...FAST_LEASES, AGENTPLANE_MODE: 'development' } });
  const api = p.root;
  const principal = (await api.post<{ id: string }>(`/v1/organizations/workspaces/${p.bootstrap.workspace_id}/principals`, {
    external_subject_id: 'acp-user', principal_type: 'person', display_name: 'ACP User',
  })).id;
  const envId = (await api.post<{ id: string }>('/v1/environments', {
    name: 'acp', image: 'agentplane/sandbox:latest',
    resources: { cpu_millis: 1000, memory_mib: 512, disk_mib: 512, max_duration_seconds: 120 },
    harness: { kind: 'acp', package: FIXTURE_PACKAGE, command: FIXTURE_COMMAND },
  })).id;
  const daemons = new Map<string, ChildProcess>();
  return {
    p, api, principal, envId, daemons,
    async daemon(label) {
      const { dir, runnerId } = await pairDaemon(p, principal, label);
      daemons.set(runnerId, startDaemon(dir, ['--acp-harness', tarball]));
      return runnerId;
    },
    async ready(ids) {
      await waitFor(`${ids.length} runner(s) with the ACP harness`, async () => {
        const r = await api.get<{ data: Array<{ runner: string; status: string; capabilities: { providers: Json[] } }> }>('/v1/runner-pools/presences');
        const up = r.data.filter((x) => ids.includes(x.runner) && x.status === 'ready' && x.capabilities.providers.some((pr) => Array.isArray(pr.acp_harnesses) && pr.acp_harnesses.length > 0));
        return up.length === ids.length ? true : undefined;
      }, 150_000);
    },
    async stop() {
      for (const d of daemons.values()) d.kill('SIGKILL');
      await p.stop();
    },
  };
}
