/**
 * Built-in tools. Every one executes inside the Session's sandbox through the driver — for the
 * docker driver nothing touches the host filesystem. Paths are relative to the workspace.
 */
import {
  capText,
  capStreams,
  clampTimeout,
  failureNote,
  fields,
  metaOf,
  TOOL_LIMITS,
  ToolInputError,
  type BuiltinTool,
  type ToolContext,
  type ToolOutcome,
} from './types.js';
import { compileGlob, GlobError, type CompiledGlob } from '@agentplane/core/glob';
import { BROWSER_TOOLS } from './browser.js';
import { SKILL_TOOL_NAME, SKILLS_DIR } from '@agentplane/protocol';

function error(content: string, meta?: ToolOutcome['meta']): ToolOutcome {
  return { content, is_error: true, meta };
}

export const bashTool: BuiltinTool = {
  spec: {
    name: 'bash',
    description:
      'Run a bash command in the sandbox (working directory: the workspace). No network. Returns stdout, stderr and the exit code; long output is truncated.',
    input_schema: {
      type: 'object',
      properties: {
        command: { type: 'string', description: 'The command line, run with bash -c.' },
        timeout_ms: { type: 'number', description: `Kill the command after this many milliseconds (default ${TOOL_LIMITS.defaultTimeoutMs}, max ${TOOL_LIMITS.maxTimeoutMs}).` },
        cwd: { type: 'string', description: 'Working directory, relative to the workspace.' },
      },
      required: ['command'],
      additionalProperties: false,
    },
  },
  async run(ctx, input) {
    const { command, timeout_ms, cwd } = fields<{ command: string; timeout_ms?: number; cwd?: string }>('bash', input, {
      command: { kind: 'string', required: true },
      timeout_ms: { kind: 'number' },
      cwd: { kind: 'string' },
    });
    const timeoutMs = clampTimeout(ctx, timeout_ms);
    // A wrong cwd is the model's mistake: it becomes a failed command, never a failed Run.
    const script = cwd ? `cd -- ${shellQuote(resolvePath(ctx, cwd))} || exit 1\n${command}` : command;
    const res = await ctx.driver.exec(ctx.sandbox, { script }, {
      timeoutMs,
      signal: ctx.signal,
      maxOutputBytes: TOOL_LIMITS.maxResultChars * 4,
    });
    const parts: string[] = [];
    const note = failureNote(res, timeoutMs);
    if (note) parts.push(note);
    // Each stream is cut on its own, so a long stdout never hides the stderr, the note or the exit code.
    const streams = capStreams(res.stdout.replace(/\n$/, ''), res.stderr.replace(/\n$/, ''));
    if (streams.stdout) parts.push(streams.stdout);
    if (streams.stderr) parts.push(`[stderr]\n${streams.stderr}`);
    parts.push(`[exit code ${res.exitCode}]`);
    return { content: parts.join('\n'), is_error: res.exitCode !== 0 || note !== undefined, meta: { ...metaOf(res), truncated: res.truncated || streams.truncated } };
  },
};

export function shellQuote(value: string): string {
  return `'${value.replace(/'/g, `'\\''`)}'`;
}

/** Workspace-relative or absolute path as the sandbox sees it. */
export function resolvePath(ctx: ToolContext, path: string): string {
  if (path.startsWith('/')) return path;
  const base = ctx.sandbox.workspace.replace(/\/$/, '');
  return path === '' || path === '.' ? base : `${base}/${path}`;
}

export const readTool: BuiltinTool = {
  spec: {
    name: 'read',
    description: 'Read a text file from the workspace, with line numbers. Use offset and limit for long files.',
    input_schema: {
      type: 'object',
      properties: {
        path: { type: 'string' },
        offset: { type: 'number', description: 'First line to return (1-based, default 1).' },
        limit: { type: 'number', description: 'Number of lines to return (default 2000).' },
      },
      required: ['path'],
      additionalProperties: false,
    },
  },
  async run(ctx, input) {
    const { path, offset, limit } = fields<{ path: string; offset?: number; limit?: number }>('read', input, {
      path: { kind: 'string', required: true },
      offset: { kind: 'number' },
      limit: { kind: 'number' },
    });
    const start = Math.max(1, Math.floor(offset ?? 1));
    const count = Math.max(1, Math.floor(limit ?? 2000));
    const script =
      '[ -f "$1" ] || { echo "no such file: $1" >&2; exit 2; }; ' +
      'awk -v s="$2" -v n="$3" \'NR>=s && NR<s+n { printf "%6d\\t%s\\n", NR, $0 } NR>=s+n { exit }\' < "$1"';
    const res = await ctx.driver.exec(ctx.sandbox, ['bash', '-c', script, 'read', resolvePath(ctx, path), String(start), String(count)], {
      timeoutMs: clampTimeout(ctx, 30_000),
      signal: ctx.signal,
      maxOutputBytes: TOOL_LIMITS.maxResultChars * 4,
    });
    // Output cut at the cap may have ended the command: what came is still the file's beginning.
    if (res.exitCode !== 0 && !res.truncated) return error(res.stderr.trim() || `read failed (exit ${res.exitCode})`, metaOf(res));
    const out = capText(res.stdout);
    return { content: out.text || '(empty)', is_error: false, meta: { ...metaOf(res), truncated: res.truncated || out.truncated } };
  },
};

async function writeFile(ctx: ToolContext, path: string, content: string): Promise<ToolOutcome | undefined> {
  const res = await ctx.driver.exec(ctx.sandbox, ['bash', '-c', 'mkdir -p -- "$(dirname -- "$1")" && cat > "$1"', 'write', resolvePath(ctx, path)], {
    stdin: content,
    timeoutMs: clampTimeout(ctx, 60_000),
    signal: ctx.signal,
    maxOutputBytes: 64 * 1024,
  });
  if (res.exitCode !== 0) return error(res.stderr.trim() || `write failed (exit ${res.exitCode})`, metaOf(res));
  return undefined;
}

export const writeTool: BuiltinTool = {
  spec: {
    name: 'write',
    description: 'Create or overwrite a file in the workspace with the given content (parent directories are created).',
    input_schema: {
      type: 'object',
      properties: { path: { type: 'string' }, content: { type: 'string' } },
      required: ['path', 'content'],
      additionalProperties: false,
    },
  },
  async run(ctx, input) {
    const { path, content } = fields<{ path: string; content: string }>('write', input, {
      path: { kind: 'string', required: true },
      content: { kind: 'string', required: true },
    });
    const failed = await writeFile(ctx, path, content);
    return failed ?? { content: `wrote ${Buffer.byteLength(content)} bytes to ${path}`, is_error: false };
  },
};

/** Characters of the base64 of `bytes` bytes. */
const base64Length = (bytes: number): number => 4 * Math.ceil(bytes / 3);

function occurrences(haystack: string, needle: string): number {
  let count = 0;
  for (let i = haystack.indexOf(needle); i !== -1; i = haystack.indexOf(needle, i + needle.length)) count++;
  return count;
}

export const editTool: BuiltinTool = {
  spec: {
    name: 'edit',
    description:
      'Replace an exact string in a file. old_string must match exactly once (include surrounding lines to make it unique) unless replace_all is true.',
    input_schema: {
      type: 'object',
      properties: {
        path: { type: 'string' },
        old_string: { type: 'string' },
        new_string: { type: 'string' },
        replace_all: { type: 'boolean' },
      },
      required: ['path', 'old_string', 'new_string'],
      additionalProperties: false,
    },
  },
  async run(ctx, input) {
    const args = fields<{ path: string; old_string: string; new_string: string; replace_all?: boolean }>('edit', input, {
      path: { kind: 'string', required: true },
      old_string: { kind: 'string', required: true },
      new_string: { kind: 'string', required: true },
      replace_all: { kind: 'boolean' },
    });
    if (args.old_string === '') throw new ToolInputError('edit', "'old_string' must not be empty");
    if (args.old_string === args.new_string) throw new ToolInputError('edit', "'new_string' must differ from 'old_string'");
    // At most one byte past the cap leaves the sandbox: a larger file (or a device such as
    // /dev/zero behind a symlink) is refused without streaming it through the runner. The bytes
    // come as base64: the file is rewritten whole, so it must be read exactly, not as text.
    const res = await ctx.driver.exec(ctx.sandbox, ['bash', '-c', 'set -o pipefail; head -c "$2" -- "$1" | base64 -w 0', 'edit', resolvePath(ctx, args.path), String(TOOL_LIMITS.maxFileBytes + 1)], {
      timeoutMs: clampTimeout(ctx, 30_000),
      signal: ctx.signal,
      maxOutputBytes: base64Length(TOOL_LIMITS.maxFileBytes + 1),
    });
    if (res.exitCode !== 0 && !res.truncated) return error(res.stderr.trim() || `cannot read ${args.path}`, metaOf(res));
    const bytes = Buffer.from(res.stdout, 'base64');
    if (res.truncated || bytes.length > TOOL_LIMITS.maxFileBytes) return error(`${args.path} is larger than ${TOOL_LIMITS.maxFileBytes} bytes; edit it with bash instead`);
    // A file that is not UTF-8 (Latin-1, binary) cannot be edited as text without rewriting every
    // byte that does not decode: it is refused and left as it was.
    let text: string;
    try {
      text = new TextDecoder('utf-8', { fatal: true, ignoreBOM: true }).decode(bytes);
    } catch {
      return error(`${args.path} is not UTF-8 text; edit it with bash instead`);
    }
    const found = occurrences(text, args.old_string);
    if (found === 0) return error(`old_string was not found in ${args.path}`);
    if (found > 1 && !args.replace_all) {
      return error(`old_string matches ${found} times in ${args.path}; include more surrounding context to make it unique, or set replace_all`);
    }
    // The edited file is held in memory here before it is written: it obeys the same bound as the
    // file read, checked before it is built (replace_all of a short string by a long one multiplies).
    const replaced = args.replace_all ? found : 1;
    const size = bytes.length + replaced * (Buffer.byteLength(args.new_string) - Buffer.byteLength(args.old_string));
    if (size > TOOL_LIMITS.maxFileBytes) {
      return error(`the edited ${args.path} would be ${size} bytes, larger than ${TOOL_LIMITS.maxFileBytes}; edit it with bash instead`);
    }
    const updated = args.replace_all ? text.split(args.old_string).join(args.new_string) : text.replace(args.old_string, () => args.new_string);
    const failed = await writeFile(ctx, args.path, updated);
    return failed ?? { content: `replaced ${replaced} occurrence(s) in ${args.path}`, is_error: false };
  },
};

/** Bounds on one `glob` call, whatever pattern the model sends. */
export const GLOB_TOOL_LIMITS = {
  /** Longest pattern accepted (the matcher's own limit is higher). */
  maxPatternLength: 1024,
  /** Files examined per call; a larger tree is reported as incomplete. */
  maxFiles: 100_000,
  /** Paths returned to the model. */
  maxShown: 1000,
  /** Matcher work per call, in NFA steps (roughly 1-2 s of CPU at most). */
  maxSteps: 100_000_000,
  /** Longest stretch of matching before yielding to the event loop. */
  sliceMs: 5,
  /** Matcher steps between two looks at the clock (well under a millisecond). */
  sliceSteps: 20_000,
} as const;

const yieldToEventLoop = (): Promise<void> => new Promise((resolve) => setImmediate(resolve));

export const globTool: BuiltinTool = {
  spec: {
    name: 'glob',
    description:
      'Find files whose workspace-relative path matches a glob such as "**/*.ts" or "src/*.{js,json}" (also ?, [a-z], [!a-z], nested {a,b}, \\ escapes). Returns up to 1000 paths.',
    input_schema: {
      type: 'object',
      properties: { pattern: { type: 'string' }, path: { type: 'string', description: 'Directory to search (default: the workspace).' } },
      required: ['pattern'],
      additionalProperties: false,
    },
  },
  async run(ctx, input) {
    const { pattern, path } = fields<{ pattern: string; path?: string }>('glob', input, {
      pattern: { kind: 'string', required: true },
      path: { kind: 'string' },
    });
    if (pattern.length > GLOB_TOOL_LIMITS.maxPatternLength) {
      throw new ToolInputError('glob', `'pattern' must be at most ${GLOB_TOOL_LIMITS.maxPatternLength} characters`);
    }
    let matcher: CompiledGlob;
    try {
      matcher = compileGlob(pattern.replace(/^\.\//, ''));
    } catch (err) {
      if (err instanceof GlobError) throw new ToolInputError('glob', err.message);
      throw err;
    }
    const timeoutMs = clampTimeout(ctx, 60_000);
    const deadline = Date.now() + timeoutMs;
    const root = resolvePath(ctx, path ?? '.');
    // The walk runs in the sandbox under the timeout; at most maxFiles + 1 paths come back.
    const walk = 'cd -- "$1" && find . -name .git -prune -o -type f -print0 | head -z -n "$2"';
    const res = await ctx.driver.exec(ctx.sandbox, ['bash', '-c', walk, 'glob', root, String(GLOB_TOOL_LIMITS.maxFiles + 1)], {
      timeoutMs,
      signal: ctx.signal,
      maxOutputBytes: 16 * 1024 * 1024,
    });
    const note = failureNote(res, timeoutMs);
    if (note && (res.killed || !res.stdout)) return error(note, metaOf(res));
    if (res.exitCode !== 0 && !res.stdout) return error(res.stderr.trim() || `glob failed (exit ${res.exitCode})`, metaOf(res));
    if (ctx.signal?.aborted) return error('The glob was interrupted.', { ...metaOf(res), killed: true });
    const paths = res.stdout.split('\0');
    // A path cut by the output cap (the last one, with no terminator) is not a whole path.
    paths.pop();
    const incomplete: string[] = [];
    if (note) incomplete.push(note);
    if (res.truncated) incomplete.push('the file list was cut at its size limit');
    if (paths.length > GLOB_TOOL_LIMITS.maxFiles) {
      paths.length = GLOB_TOOL_LIMITS.maxFiles;
      incomplete.push(`only the first ${GLOB_TOOL_LIMITS.maxFiles} files were examined`);
    }
    // Matching runs on the caller's event loop: it is linear-time, bounded by maxSteps, and runs
    // in slices (a long path is matched in several) between which it yields to the event loop,
    // so heartbeats and other Sessions keep flowing.
    const matches: string[] = [];
    const m = matcher.matcher();
    let steps = 0;
    let examined = 0;
    let sliceStart = performance.now();
    let stopped: 'interrupted' | 'timeout' | 'work' | undefined;
    /** Yields if the slice is used up; says why matching must stop, if it must. */
    const checkpoint = async (spent: number): Promise<typeof stopped> => {
      if (spent >= GLOB_TOOL_LIMITS.maxSteps) return 'work';
      if (performance.now() - sliceStart < GLOB_TOOL_LIMITS.sliceMs) return undefined;
      await yieldToEventLoop();
      sliceStart = performance.now();
      if (ctx.signal?.aborted) return 'interrupted';
      return Date.now() >= deadline ? 'timeout' : undefined;
    };
    for (const raw of paths) {
      stopped = await checkpoint(steps);
      if (stopped) break;
      const p = raw.startsWith('./') ? raw.slice(2) : raw;
      m.reset(p);
      while (!m.run(GLOB_TOOL_LIMITS.sliceSteps)) {
        stopped = await checkpoint(steps + m.steps);
        if (stopped) break;
      }
      if (stopped) break;
      steps += m.steps;
      examined++;
      if (m.matched) matches.push(p);
    }
    if (stopped === 'interrupted') return error('The glob was interrupted.', { ...metaOf(res), killed: true });
    if (stopped === 'timeout') incomplete.push(`matching timed out after ${timeoutMs} ms with ${examined} of ${paths.length} files examined`);
    if (stopped === 'work') {
      incomplete.push(`matching stopped at its work limit with ${examined} of ${paths.length} files examined; use a simpler pattern or a narrower path`);
    }
    matches.sort();
    const shown = matches.slice(0, GLOB_TOOL_LIMITS.maxShown);
    const parts = [shown.length ? shown.join('\n') : 'no files matched'];
    if (matches.length > shown.length) parts.push(`… and ${matches.length - shown.length} more`);
    if (incomplete.length) parts.push(`[incomplete: ${incomplete.join('; ')}]`);
    return { content: parts.join('\n'), is_error: false, meta: { ...metaOf(res), truncated: incomplete.length > 0 || matches.length > shown.length } };
  },
};

export const listTool: BuiltinTool = {
  spec: {
    name: 'list',
    description: 'List a directory of the workspace (directories end with "/"), recursing up to depth levels (default 1, max 5).',
    input_schema: {
      type: 'object',
      properties: { path: { type: 'string' }, depth: { type: 'number' } },
      additionalProperties: false,
    },
  },
  async run(ctx, input) {
    const { path, depth } = fields<{ path?: string; depth?: number }>('list', input ?? {}, {
      path: { kind: 'string' },
      depth: { kind: 'number' },
    });
    const levels = Math.min(5, Math.max(1, Math.floor(depth ?? 1)));
    const res = await ctx.driver.exec(
      ctx.sandbox,
      ['bash', '-c', 'cd -- "$1" && find . -mindepth 1 -maxdepth "$2" -name .git -prune -o -printf "%y %P\\n" | head -n 5000', 'list', resolvePath(ctx, path ?? '.'), String(levels)],
      { timeoutMs: clampTimeout(ctx, 30_000), signal: ctx.signal, maxOutputBytes: 4 * 1024 * 1024 },
    );
    if (res.exitCode !== 0 && !res.truncated) return error(res.stderr.trim() || `list failed (exit ${res.exitCode})`, metaOf(res));
    const lines = res.stdout
      .split('\n')
      .filter(Boolean)
      .map((l) => (l.startsWith('d ') ? `${l.slice(2)}/` : l.slice(2)))
      .sort();
    const out = capText(lines.join('\n'));
    return { content: out.text || '(empty directory)', is_error: false, meta: { ...metaOf(res), truncated: out.truncated } };
  },
};

export const grepTool: BuiltinTool = {
  spec: {
    name: 'grep',
    description: 'Search file contents with an extended regular expression. Returns path:line:text matches (binary files and .git skipped).',
    input_schema: {
      type: 'object',
      properties: {
        pattern: { type: 'string' },
        path: { type: 'string', description: 'File or directory (default: the workspace).' },
        glob: { type: 'string', description: 'Only files whose name matches, e.g. "*.ts".' },
        ignore_case: { type: 'boolean' },
        max_results: { type: 'number', description: 'Default 200.' },
      },
      required: ['pattern'],
      additionalProperties: false,
    },
  },
  async run(ctx, input) {
    const args = fields<{ pattern: string; path?: string; glob?: string; ignore_case?: boolean; max_results?: number }>('grep', input, {
      pattern: { kind: 'string', required: true },
      path: { kind: 'string' },
      glob: { kind: 'string' },
      ignore_case: { kind: 'boolean' },
      max_results: { kind: 'number' },
    });
    const max = Math.min(5000, Math.max(1, Math.floor(args.max_results ?? 200)));
    // Line by line, grep's and the cut's output flushed as it comes: the matches found before a
    // timeout reach the runner instead of dying in a pipe buffer (at most `max` lines either way).
    const flags = ['-rnIE', '--line-buffered', '--exclude-dir=.git', ...(args.ignore_case ? ['-i'] : []), ...(args.glob ? [`--include=${args.glob}`] : [])];
    const script = 'cd -- "$1" && shift && n="$1" && shift && { grep "$@" | awk -v n="$n" \'{ print; fflush() } NR >= n { exit }\'; exit "${PIPESTATUS[0]}"; }';
    const timeoutMs = clampTimeout(ctx, 60_000);
    const res = await ctx.driver.exec(ctx.sandbox, ['bash', '-c', script, 'grep', ctx.sandbox.workspace, String(max), ...flags, '-e', args.pattern, '--', args.path ?? '.'], {
      timeoutMs,
      signal: ctx.signal,
      maxOutputBytes: TOOL_LIMITS.maxResultChars * 4,
    });
    if (res.killed) return error('The grep was interrupted.', metaOf(res));
    if (res.oomKilled) return error(failureNote(res, timeoutMs) ?? 'grep was killed', metaOf(res));
    if (res.timedOut) {
      // A search of a huge tree (or a pattern that backtracks) ends at its timeout with what it found so far.
      const found = res.stdout.replace(/^\.\//gm, '').replace(/\n$/, '');
      const note = `[incomplete: the search timed out after ${timeoutMs} ms; search a narrower path, add a glob or use a simpler pattern]`;
      const out = capText(`${found || 'no matches so far'}\n${note}`);
      return { content: out.text, is_error: false, meta: { ...metaOf(res), truncated: true } };
    }
    // grep: 0 = matches, 1 = none, 2 = error; 141 = the cut closed the pipe after max results.
    if (res.exitCode === 1) return { content: 'no matches', is_error: false, meta: metaOf(res) };
    if (res.exitCode !== 0 && res.exitCode !== 141 && !res.truncated) return error(res.stderr.trim() || `grep failed (exit ${res.exitCode})`, metaOf(res));
    const out = capText(res.stdout.replace(/^\.\//gm, ''));
    return { content: out.text, is_error: false, meta: { ...metaOf(res), truncated: res.truncated || out.truncated } };
  },
};

export const BUILTIN_TOOLS: readonly BuiltinTool[] = [bashTool, readTool, writeTool, editTool, listTool, globTool, grepTool];

export { SKILL_TOOL_NAME, SKILLS_DIR };

/**
 * `skill`: opens one of the Run's skills (progressive disclosure: the system prompt names each
 * skill and its description; this returns its `SKILL.md`, whose other files the model may then
 * read under the skill's directory). Offered only to Runs that carry skills.
 */
export const skillTool: BuiltinTool = {
  spec: {
    name: SKILL_TOOL_NAME,
    description: 'Open one of the skills listed in your instructions: returns its SKILL.md (the instructions). Its other files are under the directory it names.',
    input_schema: {
      type: 'object',
      properties: { name: { type: 'string', description: 'The skill\'s name, as listed.' } },
      required: ['name'],
      additionalProperties: false,
    },
  },
  async run(ctx, input) {
    const { name } = fields<{ name: string }>(SKILL_TOOL_NAME, input, { name: { kind: 'string', required: true } });
    if (!/^[a-z0-9](?:[a-z0-9._-]{0,93})$/.test(name) || name === '.' || name === '..') return error(`no skill named '${name.slice(0, 100)}'`);
    const path = `${SKILLS_DIR}/${name}/SKILL.md`;
    const res = await ctx.driver.exec(ctx.sandbox, ['bash', '-c', '[ -f "$1" ] || { echo "no skill named $2" >&2; exit 2; }; cat -- "$1"', 'skill', resolvePath(ctx, path), name], {
      timeoutMs: clampTimeout(ctx, 30_000),
      signal: ctx.signal,
      maxOutputBytes: TOOL_LIMITS.maxResultChars * 4,
    });
    if (res.exitCode !== 0 && !res.truncated) return error(res.stderr.trim() || `opening skill ${name} failed (exit ${res.exitCode})`, metaOf(res));
    const out = capText(`Skill ${name} (directory ${SKILLS_DIR}/${name}/):\n\n${res.stdout}`);
    return { content: out.text, is_error: false, meta: { ...metaOf(res), truncated: res.truncated || out.truncated } };
  },
};

export function builtinTool(name: string): BuiltinTool | undefined {
  if (name === SKILL_TOOL_NAME) return skillTool;
  return BUILTIN_TOOLS.find((t) => t.spec.name === name) ?? BROWSER_TOOLS.find((t) => t.spec.name === name);
}

/**
 * What the system prompt says about the Run's skills: each one's name and description only
 * (the body is read with the `skill` tool when the model decides it needs it).
 */
export function skillsPrompt(skills: ReadonlyArray<{ name: string; description: string }>): string {
  const lines = skills.map((k) => `- ${k.name}: ${k.description.replace(/\s+/g, ' ')}`);
  return [
    '## Skills',
    `You have these skills (read-only, under ${SKILLS_DIR}/<name>/). When one fits the task, open it with the \`${SKILL_TOOL_NAME}\` tool before you act, then follow it.`,
    ...lines,
  ].join('\n');
}

/** Runs a tool, turning input errors into error results for the model. */
export async function runTool(tool: BuiltinTool, ctx: ToolContext, input: unknown): Promise<ToolOutcome> {
  try {
    return await tool.run(ctx, input);
  } catch (err) {
    if (err instanceof ToolInputError) return error(`invalid input for ${err.tool}: ${err.message}`);
    throw err;
  }
}
