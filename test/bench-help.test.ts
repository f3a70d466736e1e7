import { execFile } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { describe, expect, it } from 'vitest';
import { benchHelpText } from '../bench/lib/help.js';
import { ROOT_DIR } from './harness/platform.js';

/**
 * Every `npm run bench:*` script answers `--help` with what it measures and the settings it reads,
 * and exits without starting anything (a bench given `--help` used to ignore it and run for minutes).
 */
const run = promisify(execFile);
const TSX = join(ROOT_DIR, 'node_modules/.bin/tsx');
const scripts = (JSON.parse(readFileSync(join(ROOT_DIR, 'package.json'), 'utf8')) as { scripts: Record<string, string> }).scripts;
const benches = Object.entries(scripts)
  .filter(([name]) => name.startsWith('bench:'))
  .map(([name, command]) => ({ name, file: /tsx (bench\/[\w-]+\.ts)/.exec(command)?.[1] ?? '' }));

/** The variables a bench's own file reads. */
const readBy = (file: string): string[] =>
  [...new Set([...readFileSync(join(ROOT_DIR, file), 'utf8').matchAll(/process\.env\.([A-Z][A-Z0-9_]*)/g)].map((m) => m[1] as string))].filter((v) => v !== 'PATH' && v !== 'HOME');

describe('bench --help', () => {
  it('every bench script names its file, which answers --help', () => {
    expect(benches.length).toBeGreaterThan(15);
    expect(benches.filter((b) => b.file === '').map((b) => b.name)).toEqual([]);
    expect(benches.filter((b) => !readFileSync(join(ROOT_DIR, b.file), 'utf8').includes('benchHelp(import.meta.url);')).map((b) => b.name)).toEqual([]);
  });

  it("each bench's help names every variable its file reads", () => {
    for (const { name, file } of benches) {
      const help = benchHelpText(join(ROOT_DIR, file));
      expect(help, name).toContain(`${name}: npm run ${name}`);
      expect(readBy(file).filter((v) => !new RegExp(`^  ${v}\\b`, 'm').test(help)), name).toEqual([]);
    }
  });

  it('a variable only a comment names is not listed (bench:events reads no BENCH_ROUNDS; the help module\'s own comment shows it)', () => {
    const help = benchHelpText(join(ROOT_DIR, 'bench/events.ts'));
    expect(help).toContain('  BENCH_DRIVE_ROUNDS (default 3)');
    expect(help).not.toMatch(/^  BENCH_ROUNDS\b/m);
  });

  const env = { PATH: process.env.PATH ?? '/usr/bin:/bin', HOME: process.env.HOME ?? '/tmp' };
  it('every bench --help prints the help and exits 0 before starting anything (nothing it imports fails first)', async () => {
    // No Redis, no Docker, no port given: a bench that started its work would fail or outlive the bound.
    const failed: string[] = [];
    const queue = [...benches];
    await Promise.all(Array.from({ length: 4 }, async () => {
      for (let b = queue.shift(); b; b = queue.shift()) {
        const out = await run(TSX, [b.file, '--help'], { cwd: ROOT_DIR, timeout: 90_000, env }).catch((err: { stderr?: string }) => ({ stdout: `failed: ${String(err.stderr ?? err).slice(0, 300)}` }));
        if (out.stdout !== benchHelpText(join(ROOT_DIR, b.file))) failed.push(`${b.name}: ${out.stdout.slice(0, 300)}`);
      }
    }));
    expect(failed).toEqual([]);
  }, 300_000);

  it('anything else on a bench\'s command line is one line and exit code 2, before anything starts', async () => {
    const r = await run(TSX, ['bench/api.ts', '--rounds', '3'], { cwd: ROOT_DIR, timeout: 60_000, env }).then(() => null, (err: { code?: number; stderr?: string; stdout?: string }) => err);
    expect(r?.code).toBe(2);
    expect(r?.stdout).toBe('');
    expect(r?.stderr).toBe("unknown argument '--rounds': this bench takes only --help, and its settings from the environment (see --help)\n");
  }, 90_000);
});
