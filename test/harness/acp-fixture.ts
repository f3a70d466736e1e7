/**
 * The fixture ACP agent (test/fixtures/acp-agent/agent.ts) as an installable npm package: bundled
 * with the SDK into one file by esbuild, packed with `npm pack` into a tarball that a runner
 * installs offline (`--acp-harness <tarball>`), like any ACP harness from a registry.
 */
import { execFileSync } from 'node:child_process';
import { mkdirSync, mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { build } from 'esbuild';
import { ROOT_DIR } from './platform.js';

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
