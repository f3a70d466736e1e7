/**
 * Repository-level checks on what gets installed: the committed lockfile is complete (what
 * `npm ci` needs on every platform) and one MCP SDK line is a dependency.
 */
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { ROOT_DIR } from './harness/platform.js';

interface LockEntry {
  version?: string;
  link?: boolean;
  dependencies?: Record<string, string>;
  optionalDependencies?: Record<string, string>;
  peerDependencies?: Record<string, string>;
  peerDependenciesMeta?: Record<string, { optional?: boolean }>;
}

const readJson = <T>(path: string): T => JSON.parse(readFileSync(join(ROOT_DIR, path), 'utf8')) as T;
const lock = readJson<{ packages: Record<string, LockEntry> }>('package-lock.json');
const root = readJson<{ workspaces: string[] }>('package.json');

/** Where npm finds `name` for the package at `at`: its own node_modules, then each ancestor's. */
function resolve(at: string, name: string): string | undefined {
  let base = at;
  for (;;) {
    const candidate = base === '' ? `node_modules/${name}` : `${base}/node_modules/${name}`;
    if (lock.packages[candidate]) return candidate;
    if (base === '') return undefined;
    const cut = base.lastIndexOf('/node_modules/');
    base = cut === -1 ? '' : base.slice(0, cut);
  }
}

describe('package-lock.json', () => {
  it("locks every dependency of every locked package, each platform's optional ones included", () => {
    const missing: string[] = [];
    for (const [at, entry] of Object.entries(lock.packages)) {
      if (entry.link) continue;
      const wanted = { ...entry.dependencies, ...entry.optionalDependencies };
      for (const name of Object.keys(wanted)) if (!resolve(at, name)) missing.push(`${at || '(root)'} → ${name}`);
    }
    expect(missing).toEqual([]);
  });
});

describe('one MCP SDK', () => {
  it('no package depends on the v1 SDK (@modelcontextprotocol/sdk), and it is not installed', () => {
    const manifests = ['package.json', ...root.workspaces.map((w) => `${w}/package.json`)];
    const dependents = manifests.filter((m) => {
      const pkg = readJson<Record<string, Record<string, string> | undefined>>(m);
      return ['dependencies', 'devDependencies', 'optionalDependencies', 'peerDependencies'].some((k) => pkg[k]?.['@modelcontextprotocol/sdk'] !== undefined);
    });
    expect(dependents).toEqual([]);
    expect(Object.keys(lock.packages).filter((k) => k.endsWith('node_modules/@modelcontextprotocol/sdk'))).toEqual([]);
  });
});
