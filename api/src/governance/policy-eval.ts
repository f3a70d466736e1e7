/**
 * ActionPolicy evaluation: pure, deterministic, linear in the number of rules (patterns are
 * compiled once per policy-set version with the linear-time glob matcher; no RegExp is ever built
 * from a user's pattern). docs/GOVERNANCE.md, "ActionPolicies", states the precedence.
 */
import { posix } from 'node:path';
import { ApiError, compileGlob, type CompiledGlob } from '@agentplane/core';

export const POLICY_EFFECTS = ['allow', 'deny', 'require_approval'] as const;
export type PolicyEffect = (typeof POLICY_EFFECTS)[number];

/** Where a call comes from: a harness tool (built-in, custom, MCP connection), an MCP edge tool, a drive event. */
export const TOOL_KINDS = ['builtin', 'custom', 'mcp', 'api', 'drive', 'a2a'] as const;
export type ToolKind = (typeof TOOL_KINDS)[number];

/** A rule as stored (the fields evaluation reads). */
export interface PolicyRule {
  id: string;
  effect: PolicyEffect;
  /** `any` or one kind. */
  tool_kind: ToolKind | 'any';
  /** Exact name or glob (`*`, `?`, `[…]`, `{a,b}`); `*` matches every name. */
  tool_name: string;
  /** MCP tools: only this Connection's. */
  connection_id?: string | null | undefined;
  /** bash: the command starts with this (word boundary). */
  command_prefix?: string | null | undefined;
  /** file tools (read, write, edit, glob, list, grep): the `path` argument matches this glob. */
  path_glob?: string | null | undefined;
  /** Only calls made for this Principal. */
  principal_id?: string | null | undefined;
  created_at: string;
}

/** One call to decide. */
export interface ToolCall {
  kind: ToolKind;
  name: string;
  connection_id?: string | undefined;
  input?: unknown;
  /** The Principal the call is made for, when known. */
  principal_id?: string | undefined;
}

export interface PolicyDecision {
  decision: PolicyEffect;
  /** The deciding rule, or null when no rule matched (the default: allow). */
  rule_id: string | null;
  explanation: string;
  /** Every matching rule, most specific first (dry runs show it). */
  matched: { rule_id: string; effect: PolicyEffect; specificity: number }[];
}

interface Compiled {
  rule: PolicyRule;
  exactName: string | null;
  nameGlob: CompiledGlob | null;
  /** Literal text a name pattern starts and ends with: cheap necessary conditions tested before the glob. */
  head: string;
  tail: string;
  pathGlob: CompiledGlob | null;
  /**
   * The directory every path the rule's `path_glob` names lies under (its literal head, resolved
   * against the workspace): a search (`grep`, `glob`) of a directory above it can reach them.
   */
  globRoot: string | null;
  specificity: number;
  order: number;
}

/**
 * A decision made where no ActionApproval can be waited for (a request's boundary, an A2A call):
 * anything but `allow` refuses the call (403 `policy.denied`, naming the rule); null when allowed.
 */
export function boundaryRefusal(d: PolicyDecision): ApiError | null {
  if (d.decision === 'allow') return null;
  return new ApiError('policy.denied', d.decision === 'deny' ? d.explanation : `${d.explanation}; an approval cannot be waited for at this boundary, so the request is refused`);
}

/** Shell control characters: a command holding them can still match deny/approval prefixes, never an allow prefix. */
const SHELL_CONTROL = /[;&|`$<>(){}\n\r\\]/;
const EFFECT_RANK: Record<PolicyEffect, number> = { deny: 3, require_approval: 2, allow: 1 };
/** The builtin tools whose `path` argument a rule's `path_glob` matches. */
export const FILE_TOOL_NAMES: readonly string[] = ['read', 'write', 'edit', 'glob', 'list', 'grep'];
const FILE_TOOLS = new Set(FILE_TOOL_NAMES);
/** The file tools that read below a directory: their `path` (default the workspace) is where they search. */
const SEARCH_TOOLS: ReadonlySet<string> = new Set(['grep', 'glob']);
/** Where the builtin file tools resolve a relative `path` (the sandbox's workspace, as the agent sees it). */
const WORKSPACE = '/workspace';

const isPattern = (name: string): boolean => /[*?[{\\]/.test(name);

/**
 * Whether a rule's tool name (a name or a name pattern) can name a builtin file tool, the only
 * tools a `path_glob` applies to. A pattern that does not compile answers true: its own check
 * reports it.
 */
export function namesFileTool(toolName: string): boolean {
  if (!isPattern(toolName)) return FILE_TOOLS.has(toolName);
  if (toolName === '*') return true;
  try {
    const glob = compileGlob(toolName, { segments: false });
    return [...FILE_TOOLS].some((name) => glob.test(name));
  } catch {
    return true;
  }
}

/** Compile-time check of a rule's patterns; throws GlobError with the reason. */
export function compileRule(rule: PolicyRule, order: number): Compiled {
  const pattern = isPattern(rule.tool_name);
  const exactName = pattern ? null : rule.tool_name;
  const nameGlob = pattern && rule.tool_name !== '*' ? compileGlob(rule.tool_name, { segments: false }) : null;
  const pathGlob = rule.path_glob ? compileGlob(rule.path_glob) : null;
  // Without escapes, the text before the first and after the last special character is literal.
  let head = '';
  let tail = '';
  if (nameGlob && !rule.tool_name.includes('\\')) {
    const specials = /[*?[\]{},]/g;
    const first = rule.tool_name.search(/[*?[\]{},]/);
    let last = -1;
    for (let m = specials.exec(rule.tool_name); m; m = specials.exec(rule.tool_name)) last = m.index;
    head = rule.tool_name.slice(0, first);
    tail = rule.tool_name.slice(last + 1);
  }
  const specificity =
    (rule.principal_id ? 16 : 0) +
    (rule.command_prefix || rule.path_glob ? 8 : 0) +
    (rule.connection_id ? 4 : 0) +
    (exactName !== null ? 2 : rule.tool_name === '*' ? 0 : 1) +
    (rule.tool_kind !== 'any' ? 1 : 0);
  return { rule, exactName, nameGlob, head, tail, pathGlob, globRoot: rule.path_glob ? globRootOf(rule.path_glob) : null, specificity, order };
}

function argString(input: unknown, field: string): string | undefined {
  if (typeof input !== 'object' || input === null) return undefined;
  const v = (input as Record<string, unknown>)[field];
  return typeof v === 'string' ? v : undefined;
}

/**
 * The path a file tool reaches, as a rule's `path_glob` is matched against it: `.` segments,
 * repeated `/` and `..` segments resolved lexically (`/w/x/../secrets/k` is `/w/secrets/k`), so
 * spelling a path differently neither escapes a deny rule nor widens an allow rule (`**` would
 * otherwise cross a `..`). An empty path is kept as it is.
 */
function lexicalPath(path: string): string {
  return path === '' ? path : posix.normalize(path);
}

/** A tool's `path` as the tool reaches it: relative to the workspace unless absolute, resolved lexically. */
function reachedPath(path: string): string {
  return lexicalPath(path.startsWith('/') ? path : `${WORKSPACE}/${path}`);
}

/** The directory a glob's literal head names (see `Compiled.globRoot`). */
function globRootOf(glob: string): string {
  const special = glob.search(/[*?[{\\]/);
  const literal = special < 0 ? glob : glob.slice(0, special);
  const dir = literal.includes('/') ? literal.slice(0, literal.lastIndexOf('/')) : '';
  return reachedPath(dir === '' && glob.startsWith('/') ? '/' : dir === '' ? '.' : dir);
}

/** Whether `dir` is `root` or a directory above it. */
function contains(dir: string, root: string): boolean {
  return dir === root || dir === '/' || root.startsWith(`${dir}/`);
}

/** How many levels a `list` shows (its `depth`, 1 to 5, default 1), as the runner's tool reads it. */
function listDepth(input: unknown): number {
  const d = typeof input === 'object' && input !== null ? (input as Record<string, unknown>).depth : undefined;
  return Math.min(5, Math.max(1, Math.floor(typeof d === 'number' && Number.isFinite(d) ? d : 1)));
}

/**
 * Whether a listing of `dir`, `depth` levels deep, can show a name inside `root` (a glob's
 * literal directory): `root` is `dir` or below it, fewer than `depth` levels down (a name the
 * glob matches lies at least one level below `root`), or `dir` is inside `root`.
 */
function listingReaches(dir: string, depth: number, root: string): boolean {
  if (dir === root || dir.startsWith(`${root}/`) || root === '/') return true;
  if (!contains(dir, root)) return false;
  const below = (dir === '/' ? root.slice(1) : root.slice(dir.length + 1)).split('/').length;
  return below < depth;
}

/**
 * Shell separators and openings after which a new simple command begins: a deny or approval
 * prefix is matched at the start of each.
 */
const COMMAND_BREAK = /[;&|\n\r(){}`]|\$\(/;
/** What ends a command's first word for a shell: a blank, an operator, a quote or an expansion. */
const WORD_END = /[\s;&|<>(){}`$'"\\]/;

/**
 * An allow prefix matches a command that starts with it at a blank (or its end) and holds no shell
 * control character. A deny or approval prefix matches any simple command of the line (after a
 * separator, a subshell's or a substitution's opening) that starts with it where a shell ends
 * the word: `rm;ls`, `rm${IFS}/x`, `x && rm -rf /`, `$(rm x)` all match a deny of `rm`.
 */
function commandMatches(prefix: string, command: string | undefined, effect: PolicyEffect): boolean {
  if (command === undefined) return false;
  const c = command.trimStart();
  if (effect === 'allow') {
    if (!c.startsWith(prefix)) return false;
    const next = c.charAt(prefix.length);
    if (next !== '' && !/\s/.test(next) && !/\s$/.test(prefix)) return false;
    return !SHELL_CONTROL.test(c);
  }
  return c.split(COMMAND_BREAK).some((part) => {
    const p = part.trimStart();
    if (!p.startsWith(prefix)) return false;
    const next = p.charAt(prefix.length);
    return next === '' || WORD_END.test(next) || /\s$/.test(prefix);
  });
}

/** A compiled policy set: built once per version, evaluated per call. */
export class PolicySet {
  private readonly byName = new Map<string, Compiled[]>();
  private readonly patterned: Compiled[] = [];
  readonly size: number;
  /** Some rule names a Principal: only then does a call's Principal change its decision. */
  readonly principalScoped: boolean;

  constructor(rules: readonly PolicyRule[]) {
    const sorted = [...rules].sort((a, b) => a.created_at.localeCompare(b.created_at) || a.id.localeCompare(b.id));
    sorted.forEach((r, i) => {
      const c = compileRule(r, i);
      if (c.exactName !== null) {
        const list = this.byName.get(c.exactName) ?? [];
        list.push(c);
        this.byName.set(c.exactName, list);
      } else {
        this.patterned.push(c);
      }
    });
    this.size = sorted.length;
    this.principalScoped = sorted.some((r) => Boolean(r.principal_id));
  }

  private matches(c: Compiled, call: ToolCall): boolean {
    const r = c.rule;
    if (r.tool_kind !== 'any' && r.tool_kind !== call.kind) return false;
    if (c.nameGlob) {
      if (!call.name.startsWith(c.head) || !call.name.endsWith(c.tail) || call.name.length < c.head.length + c.tail.length) return false;
      if (!c.nameGlob.test(call.name)) return false;
    }
    if (r.connection_id && r.connection_id !== call.connection_id) return false;
    if (r.principal_id && r.principal_id !== call.principal_id) return false;
    if (r.command_prefix && !(call.kind === 'builtin' && call.name === 'bash' && commandMatches(r.command_prefix, argString(call.input, 'command'), r.effect))) return false;
    if (c.pathGlob) {
      if (!(call.kind === 'builtin' && FILE_TOOLS.has(call.name))) return false;
      const given = argString(call.input, 'path');
      const searches = SEARCH_TOOLS.has(call.name);
      const lists = call.name === 'list';
      // A search or a listing with no path reaches the workspace; another file tool with none reaches nothing.
      if (given === undefined && !searches && !lists) return false;
      const path = given ?? WORKSPACE;
      // An allow rule must match the path the tool reaches (relative paths are the workspace's); a
      // deny or an approval rule matches either spelling (a rule written as `./secrets/**` still
      // catches `./secrets/key`), and a search of a directory above the paths it names.
      const reached = reachedPath(path);
      const hit = c.pathGlob.test(reached)
        || (r.effect !== 'allow' && (c.pathGlob.test(path) || c.pathGlob.test(lexicalPath(path))
          || (searches && c.globRoot !== null && contains(reached, c.globRoot))
          || (lists && c.globRoot !== null && listingReaches(reached, listDepth(call.input), c.globRoot))));
      if (!hit) return false;
    }
    return true;
  }

  evaluate(call: ToolCall): PolicyDecision {
    const hits: Compiled[] = [];
    for (const c of this.byName.get(call.name) ?? []) if (this.matches(c, call)) hits.push(c);
    for (const c of this.patterned) if (this.matches(c, call)) hits.push(c);
    if (hits.length === 0) {
      return { decision: 'allow', rule_id: null, explanation: `no ActionPolicy matches ${call.kind} tool '${call.name}': allowed by default`, matched: [] };
    }
    hits.sort((a, b) => b.specificity - a.specificity || EFFECT_RANK[b.rule.effect] - EFFECT_RANK[a.rule.effect] || a.order - b.order);
    const matched = hits.map((h) => ({ rule_id: h.rule.id, effect: h.rule.effect, specificity: h.specificity }));
    const deny = hits.find((h) => h.rule.effect === 'deny');
    const decider = deny ?? (hits[0] as Compiled);
    const why = deny
      ? `denied by ActionPolicy ${deny.rule.id} (deny wins over every other match)`
      : `${decider.rule.effect === 'allow' ? 'allowed' : 'requires approval'} by ActionPolicy ${decider.rule.id} (the most specific match, specificity ${decider.specificity})`;
    return { decision: decider.rule.effect, rule_id: decider.rule.id, explanation: `${call.kind} tool '${call.name}': ${why}`, matched };
  }
}
