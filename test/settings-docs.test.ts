import { spawnSync } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { isDeepStrictEqual } from 'node:util';
import { describe, expect, it } from 'vitest';
import { loadApiConfig } from '../api/dist/config.js';
import { loadGatewayConfig } from '../gateway/dist/config.js';
import { loadPlatformConfig } from '../platform/dist/config.js';
import { loadDaemonConfig } from '../runner-daemon/dist/config.js';
import { loadSchedulerConfig } from '../scheduler/dist/config.js';
import { ROOT_DIR } from './harness/platform.js';

/**
 * What the settings' documentation says against what the processes read: each process's `--help`,
 * the README's configuration table and docs/OPERATIONS.md's "Other settings" table name the
 * environment variables its config loader reads, no more, with the defaults it applies.
 */
type Env = Record<string, string | undefined>;
type Loader = (env: Env) => unknown;

const README = readFileSync(join(ROOT_DIR, 'README.md'), 'utf8');
const OPERATIONS = readFileSync(join(ROOT_DIR, 'docs/OPERATIONS.md'), 'utf8');

/** Rows of the markdown table that follows `heading` in `text`, as trimmed cells. */
function tableRows(text: string, heading: string): string[][] {
  const start = text.indexOf(heading);
  if (start < 0) throw new Error(`no '${heading}' section`);
  const lines = text.slice(start).split('\n');
  const first = lines.findIndex((l) => l.startsWith('|'));
  const rows: string[][] = [];
  for (const line of lines.slice(first)) {
    if (!line.startsWith('|')) break;
    // A `\|` inside a cell is no column border.
    const cells = line.replaceAll('\\|', '\u0000').split('|').slice(1, -1).map((c) => c.replaceAll('\u0000', '|').trim());
    if (cells.every((c) => /^-+$/.test(c))) continue;
    rows.push(cells);
  }
  return rows.slice(1); // the header
}

const backticked = (cell: string): string[] => [...cell.matchAll(/`([^`]+)`/g)].map((m) => m[1] as string);
const VAR = /^[A-Z][A-Z0-9]*(?:_[A-Z0-9]+)*$/;

/** A row: the variables of its first column, their defaults (when the row gives one plain value each), every variable its cells name. */
const mentioned = (cells: string[]): string[] => cells.flatMap(backticked).filter((n) => VAR.test(n) && n.includes('_'));

interface DocRow { names: string[]; defaults: string[] | undefined; where: string; mentions: string[] }

/** README "Configuration": `| variables | defaults | meaning |`, the defaults backticked. */
const readmeRows: DocRow[] = tableRows(README, '## Configuration').map((cells) => {
  const names = backticked(cells[0] ?? '').filter((n) => VAR.test(n));
  const defaults = backticked(cells[1] ?? '');
  return { names, defaults: defaults.length === names.length ? defaults : undefined, where: 'README', mentions: mentioned(cells) };
});

/** docs/OPERATIONS.md "Other settings": `| variables | process | default | meaning |`. */
const operationsRows: DocRow[] = tableRows(OPERATIONS, '## Other settings').map((cells) => {
  const names = backticked(cells[0] ?? '').filter((n) => VAR.test(n));
  // "3600000 (the platform's local runner: 10000)": the value before its parenthesis.
  const defaults = (cells[2] ?? '').replace(/\s*\(.*\)\s*$/, '').split(/,\s*/).map((d) => d.replaceAll('`', '').trim());
  const plain = defaults.length === names.length && defaults.every((d) => /^[\w./:-]+$/.test(d));
  return { names, defaults: plain ? defaults : undefined, where: 'docs/OPERATIONS.md', mentions: mentioned(cells) };
});

/** The tables' variables (first column), and every variable they mention (a deprecated alias in a row's meaning). */
const documented = new Set([...readmeRows, ...operationsRows].flatMap((r) => r.names));
const mentionedInTables = new Set([...documented, ...[...readmeRows, ...operationsRows].flatMap((r) => r.mentions)]);

/** What a process needs set to load its settings at all. */
const REQUIRED: Env = { REDIS_URL: 'redis://127.0.0.1:6379', MASTER_KEY: 'ab'.repeat(32) };

interface Process { name: string; load: Loader; help: () => string; /** Its help sends the reader to the settings tables for the rest. */ defersToDocs: boolean }

const node = (args: string[]): string => {
  const r = spawnSync(process.execPath, args, { cwd: ROOT_DIR, encoding: 'utf8', env: { PATH: process.env.PATH ?? '/usr/bin:/bin' } });
  if (r.status !== 0) throw new Error(`${args.join(' ')} exited with ${String(r.status)}: ${r.stderr}`);
  return r.stdout;
};

const PROCESSES: Process[] = [
  { name: 'api', load: (env) => loadApiConfig(env), help: () => node(['api/dist/main.js', '--help']), defersToDocs: true },
  { name: 'scheduler', load: (env) => loadSchedulerConfig(env), help: () => node(['scheduler/dist/main.js', '--help']), defersToDocs: false },
  { name: 'gateway', load: (env) => loadGatewayConfig(env), help: () => node(['gateway/dist/main.js', '--help']), defersToDocs: false },
  { name: 'platform', load: (env) => loadPlatformConfig(env), help: () => node(['platform/dist/main.js', '--help']), defersToDocs: true },
  {
    name: 'runner', load: (env) => loadDaemonConfig(env, {}), defersToDocs: false,
    help: () => ['start', 'prune'].map((c) => node(['runner-daemon/dist/cli.js', c, '--help'])).join('\n'),
  },
];

/** The variables a loader reads: every name it looks up, given every documented one (set empty, as unset). */
function reads(load: Loader): Set<string> {
  const seen = new Set<string>();
  const target: Env = { ...Object.fromEntries([...documented].map((n) => [n, ''])), ...REQUIRED };
  const env = new Proxy(target, {
    get(t, k) {
      if (typeof k === 'string') seen.add(k);
      return t[k as string];
    },
  });
  load(env);
  return seen;
}

/**
 * The variables a help text's "Environment" paragraphs name (`MASTER_KEY[_FILE]` names both; a
 * name without an underscore counts when some process reads it: `PORT`, not `MiB`).
 */
function helpNames(help: string, anyRead: ReadonlySet<string>): Set<string> {
  const out = new Set<string>();
  for (const m of help.matchAll(/Environment[^\n]*\n?[\s\S]*?(?=\n\n|$)/g)) {
    for (const v of m[0].matchAll(/\b([A-Z][A-Z0-9]*(?:_[A-Z0-9]+)*)(\[(_[A-Z0-9]+)\])?/g)) {
      const name = v[1] as string;
      if (!name.includes('_') && !anyRead.has(name)) continue;
      out.add(name);
      if (v[3]) out.add(`${name}${v[3]}`);
    }
  }
  return out;
}

/** Read by packages/core itself in every process, not by a config loader: the tracing settings and the crash points. */
const outsideLoaders = (name: string): boolean => name.startsWith('OTEL_') || name === 'AGENTPLANE_CRASH_AT';

const loaded = PROCESSES.map((p) => ({ ...p, reads: reads(p.load), helpText: p.help() }));
const anyRead: ReadonlySet<string> = new Set(loaded.flatMap((p) => [...p.reads]));

describe('--help names the settings each process reads', () => {
  for (const p of loaded) {
    it(`${p.name}: every variable it reads is in its --help${p.defersToDocs ? ' or the settings tables its help points to' : ''}`, () => {
      const named = helpNames(p.helpText, anyRead);
      expect(p.reads.size).toBeGreaterThan(5);
      const missing = [...p.reads].filter((n) => !named.has(n) && !(p.defersToDocs && mentionedInTables.has(n)));
      expect(missing).toEqual([]);
    });

    it(`${p.name}: every variable its --help names is read`, () => {
      const named = [...helpNames(p.helpText, anyRead)];
      expect(named.length).toBeGreaterThan(3);
      expect(named.filter((n) => !p.reads.has(n) && !outsideLoaders(n))).toEqual([]);
    });
  }

  it('the helps that point to the settings tables say where they are', () => {
    for (const p of loaded.filter((x) => x.defersToDocs)) {
      const text = p.helpText.replace(/\s+/g, ' ');
      expect(text).toContain("README's settings table");
      expect(text).toContain('docs/OPERATIONS.md ("Other settings")');
    }
  });
});

describe('the settings tables', () => {
  it('name only variables some process reads', () => {
    const read = new Set(loaded.flatMap((p) => [...p.reads]));
    expect(documented.size).toBeGreaterThan(60);
    expect([...documented].filter((n) => !read.has(n) && !outsideLoaders(n))).toEqual([]);
  });

  it('name every variable a process reads', () => {
    const read = new Set(loaded.flatMap((p) => [...p.reads]));
    expect([...read].filter((n) => !mentionedInTables.has(n))).toEqual([]);
  });

  /**
   * A documented default is right when setting it changes nothing: some process that reads the
   * variable loads the same settings with it set to the documented value as without it.
   */
  it('give the defaults the processes apply', () => {
    /** Defaults the tables give as what they come to where they are used: the loaders leave them unset. */
    const derivedWhereUsed = new Set(['CONSOLE_DIR', 'GATEWAY_LINK_URL']);
    const rows = [...readmeRows, ...operationsRows].filter((r) => r.defaults !== undefined);
    expect(rows.length).toBeGreaterThan(30);
    const wrong: string[] = [];
    for (const row of rows) {
      row.names.forEach((name, i) => {
        // `http://HOST:PORT`: the listen address's defaults.
        const value = ((row.defaults as string[])[i] as string).replace('HOST', '127.0.0.1').replace('PORT', '8080');
        const readers = loaded.filter((p) => p.reads.has(name));
        if (readers.length === 0 || derivedWhereUsed.has(name) || outsideLoaders(name)) return; // the table test above names an unread one
        const same = readers.some((p) => isDeepStrictEqual(p.load({ ...REQUIRED, [name]: value }), p.load({ ...REQUIRED })));
        if (!same) wrong.push(`${row.where}: ${name} = ${value}`);
      });
    }
    expect(wrong).toEqual([]);
  });
});
