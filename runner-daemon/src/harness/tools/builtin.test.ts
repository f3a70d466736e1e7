import { randomBytes } from 'node:crypto';
import { monitorEventLoopDelay } from 'node:perf_hooks';
import Docker from 'dockerode';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { DockerDriver } from '../../sandbox/docker-driver.js';
import { ensureSandboxImage } from '../../sandbox/image.js';
import type { ExecResult, Sandbox } from '../../sandbox/types.js';
import { bashTool, editTool, globTool, grepTool, listTool, readTool, runTool, writeTool } from './builtin.js';
import { TOOL_LIMITS, type ToolContext } from './types.js';

const runnerId = `ttest-${randomBytes(4).toString('hex')}`;
const docker = new Docker();
const driver = new DockerDriver({ runnerId, docker });
let sandbox: Sandbox;
let ctx: ToolContext;

beforeAll(async () => {
  await ensureSandboxImage({ docker });
  sandbox = await driver.ensure({ id: `sess_${randomBytes(8).toString('hex')}` }, {});
  ctx = { driver, sandbox };
}, 120_000);

afterAll(async () => {
  await driver.reapOrphans(runnerId, []);
});

describe('built-in tools inside a docker sandbox', () => {
  it('write, read, edit', async () => {
    expect(await runTool(writeTool, ctx, { path: 'src/app.ts', content: 'const a = 1;\nconst b = 1;\n' })).toMatchObject({ is_error: false });
    const read = await runTool(readTool, ctx, { path: 'src/app.ts' });
    expect(read.content).toBe('     1\tconst a = 1;\n     2\tconst b = 1;\n');
    const partial = await runTool(readTool, ctx, { path: 'src/app.ts', offset: 2, limit: 1 });
    expect(partial.content).toBe('     2\tconst b = 1;\n');

    const ambiguous = await runTool(editTool, ctx, { path: 'src/app.ts', old_string: ' = 1;', new_string: ' = 2;' });
    expect(ambiguous.is_error).toBe(true);
    expect(ambiguous.content).toContain('matches 2 times');
    const missing = await runTool(editTool, ctx, { path: 'src/app.ts', old_string: 'nope', new_string: 'x' });
    expect(missing).toMatchObject({ is_error: true });
    const ok = await runTool(editTool, ctx, { path: 'src/app.ts', old_string: 'const b = 1;', new_string: 'const b = 2; // $& kept' });
    expect(ok.is_error).toBe(false);
    const all = await runTool(editTool, ctx, { path: 'src/app.ts', old_string: 'const', new_string: 'let', replace_all: true });
    expect(all.content).toContain('replaced 2');
    expect((await driver.exec(sandbox, ['cat', 'src/app.ts'])).stdout).toBe('let a = 1;\nlet b = 2; // $& kept\n');

    const absent = await runTool(readTool, ctx, { path: 'nope.txt' });
    expect(absent).toMatchObject({ is_error: true });
    expect(absent.content).toContain('no such file');
    // Writes happen in the sandbox as the sandbox user.
    expect((await driver.exec(sandbox, ['stat', '-c', '%u', 'src/app.ts'])).stdout.trim()).toBe('10001');
  });

  it('bash: a long stdout never hides the stderr, the exit code, or why output was cut', async () => {
    const long = await runTool(bashTool, ctx, { command: 'seq 1 40000; echo IMPORTANT-ERR >&2; exit 3' });
    expect(long.is_error).toBe(true);
    expect(long.content).toContain('[truncated');
    expect(long.content).toContain('[stderr]\nIMPORTANT-ERR');
    expect(long.content.endsWith('[exit code 3]')).toBe(true);
    expect(long.content.length).toBeLessThan(TOOL_LIMITS.maxResultChars + 200);
    // Both streams long: each keeps a share, the exit code closes the result.
    const both = await runTool(bashTool, ctx, { command: 'seq 1 40000; seq 1 40000 | sed s/^/E/ >&2; exit 4' });
    expect(both.content).toMatch(/^1\n2\n/);
    expect(both.content).toContain('[stderr]\nE1\nE2\n');
    expect(both.content.endsWith('[exit code 4]')).toBe(true);
    expect(both.content.length).toBeLessThan(TOOL_LIMITS.maxResultChars + 200);
  });

  it('edit refuses a result larger than its file bound before building it, and leaves the file as it was', async () => {
    const made = await driver.exec(sandbox, { script: 'mkdir -p edits && head -c 2000000 /dev/zero | tr "\\0" a > edits/many.txt' });
    expect(made.exitCode).toBe(0);
    // 2 000 000 one-byte matches, each replaced by 64 bytes: 128 MB, far past the 10 MiB bound.
    const res = await runTool(editTool, ctx, { path: 'edits/many.txt', old_string: 'a', new_string: 'b'.repeat(64), replace_all: true });
    expect(res.is_error).toBe(true);
    expect(res.content).toContain(`larger than ${TOOL_LIMITS.maxFileBytes}`);
    expect((await driver.exec(sandbox, ['wc', '-c', 'edits/many.txt'])).stdout.trim()).toBe('2000000 edits/many.txt');
    // Under the bound it still works.
    const fits = await runTool(editTool, ctx, { path: 'edits/many.txt', old_string: 'a', new_string: 'bb', replace_all: true });
    expect(fits).toMatchObject({ is_error: false, content: 'replaced 2000000 occurrence(s) in edits/many.txt' });
    expect((await driver.exec(sandbox, ['wc', '-c', 'edits/many.txt'])).stdout.trim()).toBe('4000000 edits/many.txt');
  });

  it('edit reads no more than one byte past its bound of a file that is larger (or endless)', async () => {
    const made = await driver.exec(sandbox, { script: 'mkdir -p edits && ln -sf /dev/zero edits/endless' });
    expect(made.exitCode).toBe(0);
    const results: ExecResult[] = [];
    const tapped: ToolContext = {
      sandbox,
      driver: {
        exec: async (...args: Parameters<typeof driver.exec>) => {
          const r = await driver.exec(...args);
          results.push(r);
          return r;
        },
      },
    };
    const res = await runTool(editTool, tapped, { path: 'edits/endless', old_string: 'a', new_string: 'b' });
    expect(res).toMatchObject({ is_error: true, content: `edits/endless is larger than ${TOOL_LIMITS.maxFileBytes} bytes; edit it with bash instead` });
    // The read ended by itself: it was not a runaway writer the driver had to stop.
    expect(results).toHaveLength(1);
    expect(results[0]).toMatchObject({ exitCode: 0, timedOut: false, killed: false });
    expect(results[0]?.stderr).toBe('');
    expect(Buffer.from(results[0]?.stdout ?? '', 'base64').length).toBe(TOOL_LIMITS.maxFileBytes + 1);
  });

  it('edit changes only what it replaces: a file that is not UTF-8 is refused and left as it was, a byte order mark kept', async () => {
    // Latin-1 "café": its 0xE9 byte does not decode as UTF-8, and writing the decoded text back
    // would turn it into U+FFFD (three other bytes).
    const latin1 = Buffer.from('/* caf\xe9 */\nint x = 1;\n', 'latin1');
    await driver.writeFiles(sandbox, [{ path: 'edits/legacy.c', data: latin1 }]);
    const refused = await runTool(editTool, ctx, { path: 'edits/legacy.c', old_string: 'int x = 1;', new_string: 'int x = 2;' });
    expect(refused).toMatchObject({ is_error: true, content: 'edits/legacy.c is not UTF-8 text; edit it with bash instead' });
    expect((await driver.exec(sandbox, ['base64', '-w', '0', 'edits/legacy.c'])).stdout).toBe(latin1.toString('base64'));

    const bom = Buffer.concat([Buffer.from([0xef, 0xbb, 0xbf]), Buffer.from('caf\u00e9 = 1\n', 'utf8')]);
    await driver.writeFiles(sandbox, [{ path: 'edits/bom.txt', data: bom }]);
    expect(await runTool(editTool, ctx, { path: 'edits/bom.txt', old_string: '= 1', new_string: '= 2' })).toMatchObject({ is_error: false });
    const after = Buffer.from((await driver.exec(sandbox, ['base64', '-w', '0', 'edits/bom.txt'])).stdout, 'base64');
    expect(after.equals(Buffer.concat([Buffer.from([0xef, 0xbb, 0xbf]), Buffer.from('caf\u00e9 = 2\n', 'utf8')]))).toBe(true);
  });

  it('bash reports output, exit codes and timeouts', async () => {
    const ok = await runTool(bashTool, ctx, { command: 'echo out; echo err >&2; exit 3' });
    expect(ok.is_error).toBe(true);
    expect(ok.content).toBe('out\n[stderr]\nerr\n[exit code 3]');
    const slow = await runTool(bashTool, ctx, { command: 'sleep 30', timeout_ms: 200 });
    expect(slow.content).toContain('timed out after 200 ms');
    expect(slow.meta?.timedOut).toBe(true);
    const big = await runTool(bashTool, ctx, { command: 'seq 1 100000' });
    expect(big.content.length).toBeLessThan(31_000);
    expect(big.meta?.truncated).toBe(true);
    await driver.exec(sandbox, ['mkdir', '-p', "it's here"]);
    const inDir = await runTool(bashTool, ctx, { command: 'pwd', cwd: "it's here" });
    expect(inDir.content).toBe("/workspace/it's here\n[exit code 0]");
    const noDir = await runTool(bashTool, ctx, { command: 'pwd', cwd: 'missing' });
    expect(noDir).toMatchObject({ is_error: true });
    expect(noDir.content).toContain('No such file or directory');
    const bad = await runTool(bashTool, ctx, { cmd: 'ls' });
    expect(bad).toMatchObject({ is_error: true });
    expect(bad.content).toContain("unknown field 'cmd'");
  });

  it('list, glob, grep', async () => {
    await driver.writeFiles(sandbox, [
      { path: 'proj/a.ts', data: Buffer.from('export const needle = 1;\n') },
      { path: 'proj/lib/b.ts', data: Buffer.from('// Needle here\n') },
      { path: 'proj/lib/c.json', data: Buffer.from('{"needle": true}\n') },
    ]);
    const list = await runTool(listTool, ctx, { path: 'proj', depth: 2 });
    expect(list.content).toBe('a.ts\nlib/\nlib/b.ts\nlib/c.json');
    const glob = await runTool(globTool, ctx, { pattern: '**/*.ts', path: 'proj' });
    expect(glob.content).toBe('a.ts\nlib/b.ts');
    const glob2 = await runTool(globTool, ctx, { pattern: 'proj/lib/*.{json,ts}' });
    expect(glob2.content).toBe('proj/lib/b.ts\nproj/lib/c.json');
    const grep = await runTool(grepTool, ctx, { pattern: 'needle', path: 'proj', ignore_case: true, glob: '*.ts' });
    expect(grep.content.trim().split('\n').sort()).toEqual(['proj/a.ts:1:export const needle = 1;', 'proj/lib/b.ts:1:// Needle here']);
    const none = await runTool(grepTool, ctx, { pattern: 'haystack', path: 'proj' });
    expect(none).toMatchObject({ is_error: false, content: 'no matches' });
    const limited = await runTool(grepTool, ctx, { pattern: 'needle', path: 'proj', ignore_case: true, max_results: 1 });
    expect(limited.content.trim().split('\n')).toHaveLength(1);
  });

  it('grep that times out returns the matches it found so far and says it is incomplete', async () => {
    // One match, then lines on which a back-reference pattern backtracks (about 0.3 ms each here,
    // 20 s for the file): the search ends at its timeout, long after the first line matched.
    const made = await driver.exec(sandbox, { script: 'mkdir -p slow && { echo "c first"; yes "aaaaaaaaaaaaaaaaaaaaaaaab c" | head -c 2000000; } > slow/b.txt' });
    expect(made.exitCode).toBe(0);
    const res = await runTool(grepTool, { ...ctx, maxTimeoutMs: 1500 }, { pattern: '^(a*)*\\1c', path: 'slow/b.txt' });
    expect(res).toMatchObject({ is_error: false, meta: { timedOut: true, truncated: true } });
    expect(res.content).toBe('1:c first\n[incomplete: the search timed out after 1500 ms; search a narrower path, add a glob or use a simpler pattern]');
  });

  it('glob: shell classes, braces and escapes; malformed patterns are the model\'s error', async () => {
    await driver.writeFiles(sandbox, ['a.txt', 'b.txt', 'c.txt', 'x.ts', 'x.js', 'x.md', 'bde.txt', '[a].txt'].map((f) => ({ path: `cls/${f}`, data: Buffer.from('') })));
    const run = async (pattern: string): Promise<string> => (await runTool(globTool, ctx, { pattern, path: 'cls' })).content;
    expect(await run('[ab].txt')).toBe('a.txt\nb.txt');
    expect(await run('[!ab].txt')).toBe('c.txt');
    expect(await run('x.{?s,md}')).toBe('x.js\nx.md\nx.ts');
    expect(await run('{a,b{c,d{e,f}}}.txt')).toBe('a.txt\nbde.txt');
    expect(await run('\\[a].txt')).toBe('[a].txt');
    const bad = await runTool(globTool, ctx, { pattern: 'src/{a,b', path: 'cls' });
    expect(bad).toMatchObject({ is_error: true });
    expect(bad.content).toContain('unclosed {');
  });

  describe('a costly glob', () => {
    const costly = `${'*a'.repeat(500)}z`;
    beforeAll(async () => {
      const made = await driver.exec(sandbox, { script: 'mkdir -p costly && cd costly && n=$(printf "a%.0s" $(seq 1 240)) && for i in $(seq 1 2000); do : > "$n$i"; done' });
      expect(made.exitCode).toBe(0);
    });

    it('stops at its work limit without blocking the event loop', async () => {
      const delay = monitorEventLoopDelay({ resolution: 10 });
      delay.enable();
      const res = await runTool(globTool, ctx, { pattern: costly, path: 'costly' });
      delay.disable();
      expect(res.is_error).toBe(false);
      expect(res.content).toContain('work limit');
      expect(res.meta?.truncated).toBe(true);
      // Matching yields every few milliseconds; a blocked loop would show the whole call.
      expect(delay.max / 1e6).toBeLessThan(500);
    });

    it('ends promptly on interrupt', async () => {
      const interrupt = new AbortController();
      // Interrupt as soon as the file walk has answered, i.e. while matching runs.
      const tapped: ToolContext = {
        sandbox,
        signal: interrupt.signal,
        driver: {
          exec: async (...args: Parameters<typeof driver.exec>) => {
            const res = await driver.exec(...args);
            setImmediate(() => interrupt.abort());
            return res;
          },
        },
      };
      const res = await runTool(globTool, tapped, { pattern: costly, path: 'costly' });
      expect(res).toMatchObject({ is_error: true, content: 'The glob was interrupted.' });
      expect(res.meta?.killed).toBe(true);
    });
  });
});
