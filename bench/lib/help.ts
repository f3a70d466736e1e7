import { existsSync, readFileSync } from 'node:fs';
import { basename, dirname, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';

/** A setting a bench reads from the environment, with the default its source gives. */
export interface BenchSetting { name: string; fallback: string | undefined }

/** The bench modules a source imports from the bench directory (`./dispatch.js`, `./lib/cost.js`), as files. */
function localImports(root: string, file: string, source: string): string[] {
  return [...source.matchAll(/from '(\.{1,2}\/[^']+)\.js'/g)]
    .map((m) => resolve(dirname(file), `${m[1] as string}.ts`))
    .filter((f) => f.startsWith(`${root}/`) && existsSync(f));
}

/**
 * The environment variables a bench reads (`process.env.BENCH_ROUNDS ?? 5`), its own and those of
 * the bench modules it imports, each with its default; PATH and the like excepted.
 */
export function benchSettings(file: string): BenchSetting[] {
  const seen = new Map<string, string | undefined>();
  const files = [file];
  for (let i = 0; i < files.length; i++) {
    const source = readFileSync(files[i] as string, 'utf8');
    // Only code reads a setting: a comment that shows one (as this file's do) is not a read.
    const code = source.split('\n').filter((line) => !/^\s*(\/\/|\/\*|\*)/.test(line)).join('\n');
    for (const m of code.matchAll(/process\.env\.([A-Z][A-Z0-9_]*)(?:\s*\?\?\s*('[^']*'|[\d_]+))?/g)) {
      const name = m[1] as string;
      if (name === 'PATH' || name === 'HOME') continue;
      if (!seen.has(name) || seen.get(name) === undefined) seen.set(name, m[2]?.replace(/^'|'$/g, '').replaceAll('_', ''));
    }
    for (const f of localImports(dirname(resolve(file)), files[i] as string, source)) if (!files.includes(f)) files.push(f);
  }
  return [...seen].map(([name, fallback]) => ({ name, fallback })).sort((a, b) => a.name.localeCompare(b.name));
}

/** The bench's help: its leading comment, then its settings. */
export function benchHelpText(file: string): string {
  const lines = readFileSync(file, 'utf8').split('\n');
  const comment: string[] = [];
  for (const line of lines) {
    const m = /^\s*(?:\/\/|\/\*\*?|\*\/?)\s?(.*)$/.exec(line);
    if (!m) break;
    if (m[1] !== undefined && m[1] !== '/' && m[1].trim() !== '') comment.push(m[1]);
  }
  const name = `bench:${basename(file, '.ts')}`;
  const settings = benchSettings(file);
  return [
    `${name}: npm run ${name}   (or: npx tsx bench/${basename(file)} [--help])`,
    '',
    ...comment,
    '',
    'Environment:',
    ...(settings.length > 0 ? settings.map((s) => `  ${s.name}${s.fallback === undefined ? '' : ` (default ${s.fallback})`}`) : ['  (none)']),
    '',
  ].join('\n');
}

/**
 * `--help` (or `-h`) on a bench's command line prints its help and exits, before anything starts:
 * a bench takes no options, only the settings its help lists, so anything else on its command
 * line (a mistyped option) is one line on stderr and exit code 2, not a run of minutes.
 */
export function benchHelp(moduleUrl: string, argv: readonly string[] = process.argv.slice(2)): void {
  if (argv.includes('--help') || argv.includes('-h')) {
    process.stdout.write(benchHelpText(fileURLToPath(moduleUrl)));
    process.exit(0);
  }
  if (argv.length > 0) {
    process.stderr.write(`unknown argument '${argv[0]}': this bench takes only --help, and its settings from the environment (see --help)\n`);
    process.exit(2);
  }
}
