/**
 * Glob matching in linear time, for every pattern a user, a model or a policy supplies.
 *
 * A pattern is parsed into a small instruction program (a Thompson NFA) and a subject is matched
 * by simulating every NFA state at once (a Pike VM): each character of the subject advances a set
 * of at most `program.length` states, so one match costs O(pattern × subject) steps whatever the
 * pattern, with no backtracking. Braces are alternation inside the NFA, never expanded, so
 * `{a,b}{c,d}…` stays linear in the pattern's length too. No regular expression is built from the
 * pattern.
 *
 * Syntax (shell-like, over `/`-separated paths unless `segments: false`):
 * - `*` any run of characters except `/`; `?` one character except `/`;
 * - `**` as a whole path segment: any number of segments (`**∕` zero or more directories, a
 *   trailing `**` everything below); elsewhere it is the same as `*`;
 * - `[abc]`, `[a-z]`, `[!a-z]` / `[^a-z]`, `[[:alpha:]]`: one character (never `/`); a `]` right
 *   after the opening `[` (or `[!`) is literal, as is `-` first or last;
 * - `{a,b,c}` alternatives, nestable; a group without a comma (`{a}`) is literal text;
 * - `\x` the character x, literally.
 * Leading dots are not special: `*` matches `.env`.
 */

/** Why a pattern was refused. */
export type GlobErrorReason = 'syntax' | 'too_complex';

/** A pattern that is malformed (`syntax`) or beyond the matcher's limits (`too_complex`). */
export class GlobError extends Error {
  readonly reason: GlobErrorReason;
  readonly pattern: string;
  /** Index in the pattern (code units) where the problem was found. */
  readonly position: number;

  constructor(reason: GlobErrorReason, pattern: string, position: number, message: string) {
    super(`invalid glob ${JSON.stringify(pattern.length > 80 ? `${pattern.slice(0, 80)}…` : pattern)}: ${message}`);
    this.name = 'GlobError';
    this.reason = reason;
    this.pattern = pattern;
    this.position = position;
  }
}

/** Hard limits, so a compiled pattern (and so each match step) stays small. */
export const GLOB_LIMITS = {
  /** Longest pattern accepted, in UTF-16 code units. */
  maxPatternLength: 4096,
  /** Deepest nesting of `{…}` groups. */
  maxBraceDepth: 16,
  /** Alternatives over all `{…}` groups of one pattern. */
  maxAlternatives: 1024,
} as const;

export interface GlobOptions {
  /**
   * true (default): `/` separates path segments — `*`, `?` and classes never match it and `**`
   * crosses it. false: the subject is one opaque string and `*` matches anything (`**` is `*`).
   */
  segments?: boolean;
  /** Match letters regardless of case (simple Unicode case folding). Default false. */
  caseInsensitive?: boolean;
}

export interface GlobMatchCost {
  matched: boolean;
  /** NFA state visits spent; at most (subject length + 1) × program size. */
  steps: number;
}

export interface CompiledGlob {
  readonly pattern: string;
  /** Number of NFA instructions: the per-character cost bound of a match. */
  readonly size: number;
  test(subject: string): boolean;
  /** Same as test, also reporting the work done (for budgets and tests). */
  measure(subject: string): GlobMatchCost;
  /** A matcher that can be run in bounded slices (to interleave long matches with other work). */
  matcher(): GlobMatcher;
}

/**
 * One match in progress, resumable: `reset(subject)`, then `run(maxSteps)` until it returns
 * true; `matched` and `steps` are then final. A matcher can be reused for subject after subject.
 */
export interface GlobMatcher {
  reset(subject: string): void;
  /** Advances by about maxSteps NFA steps (whole characters); true once the match is decided. */
  run(maxSteps: number): boolean;
  readonly matched: boolean;
  /** Steps spent on the current subject so far. */
  readonly steps: number;
}

const SLASH = 0x2f;

/**
 * Instructions. Consuming ones (char, any — not `/` when segments —, anyall, class) advance one
 * code point; split and jmp are ε-moves.
 */

interface CharClass {
  negated: boolean;
  /** Inclusive code-point ranges, flattened [lo, hi, lo, hi, …]. */
  ranges: number[];
}

type Inst =
  | { op: 'char'; cp: number }
  | { op: 'any' }
  | { op: 'anyall' }
  | { op: 'class'; cls: CharClass }
  | { op: 'split'; to: number[] }
  | { op: 'jmp'; to: number }
  | { op: 'match' };

type Node =
  | { k: 'lit'; cp: number }
  | { k: 'any' }
  | { k: 'star' }
  /** `**∕`: zero or more whole segments, each with its trailing slash. */
  | { k: 'dirs' }
  /** trailing / whole-pattern `**`: anything, slashes included. */
  | { k: 'all' }
  | { k: 'class'; cls: CharClass }
  | { k: 'alt'; alts: Node[][] };

const POSIX_CLASSES: Record<string, number[]> = {
  alpha: [0x41, 0x5a, 0x61, 0x7a],
  digit: [0x30, 0x39],
  alnum: [0x30, 0x39, 0x41, 0x5a, 0x61, 0x7a],
  upper: [0x41, 0x5a],
  lower: [0x61, 0x7a],
  space: [0x09, 0x0d, 0x20, 0x20],
  blank: [0x09, 0x09, 0x20, 0x20],
  xdigit: [0x30, 0x39, 0x41, 0x46, 0x61, 0x66],
  punct: [0x21, 0x2f, 0x3a, 0x40, 0x5b, 0x60, 0x7b, 0x7e],
  word: [0x30, 0x39, 0x41, 0x5a, 0x5f, 0x5f, 0x61, 0x7a],
};

class Parser {
  private readonly cps: number[];
  /** Code-unit offset of each code point, for error positions. */
  private readonly offsets: number[];
  private pos = 0;
  private alternatives = 0;

  constructor(
    private readonly pattern: string,
    private readonly segments: boolean,
  ) {
    this.cps = [];
    this.offsets = [];
    for (let i = 0; i < pattern.length; ) {
      const cp = pattern.codePointAt(i)!;
      this.cps.push(cp);
      this.offsets.push(i);
      i += cp > 0xffff ? 2 : 1;
    }
  }

  parse(): Node[] {
    const seq = this.sequence(0);
    if (this.pos < this.cps.length) this.fail('syntax', this.pos, 'unexpected character'); // unreachable at depth 0
    return seq;
  }

  private fail(reason: GlobErrorReason, at: number, message: string): never {
    throw new GlobError(reason, this.pattern, this.offsets[at] ?? this.pattern.length, message);
  }

  private peek(offset = 0): number | undefined {
    return this.cps[this.pos + offset];
  }

  /** A sequence, up to the end of the pattern or (inside braces) a top-level `,` or `}`. */
  private sequence(depth: number): Node[] {
    const out: Node[] = [];
    while (this.pos < this.cps.length) {
      const cp = this.cps[this.pos]!;
      if (depth > 0 && (cp === 0x2c /* , */ || cp === 0x7d /* } */)) break;
      switch (cp) {
        case 0x5c /* \ */: {
          if (this.pos + 1 >= this.cps.length) this.fail('syntax', this.pos, 'trailing backslash escapes nothing');
          out.push({ k: 'lit', cp: this.cps[this.pos + 1]! });
          this.pos += 2;
          break;
        }
        case 0x2a /* * */:
          out.push(this.stars(depth));
          break;
        case 0x3f /* ? */:
          out.push({ k: 'any' });
          this.pos++;
          break;
        case 0x5b /* [ */:
          out.push({ k: 'class', cls: this.charClass() });
          break;
        case 0x7b /* { */:
          out.push(...this.braces(depth + 1));
          break;
        default:
          out.push({ k: 'lit', cp });
          this.pos++;
      }
    }
    return out;
  }

  private stars(depth: number): Node {
    const start = this.pos;
    while (this.peek() === 0x2a) this.pos++;
    if (this.pos - start === 1 || !this.segments) return { k: 'star' };
    const before = this.cps[start - 1];
    const after = this.peek();
    const delimiter = (c: number | undefined): boolean => depth > 0 && (c === 0x2c || c === 0x7d || c === 0x7b);
    const startsSegment = before === undefined || before === SLASH || delimiter(before);
    if (!startsSegment) return { k: 'star' };
    if (after === SLASH) {
      this.pos++;
      return { k: 'dirs' };
    }
    if (after === undefined || delimiter(after)) return { k: 'all' };
    return { k: 'star' };
  }

  private braces(depth: number): Node[] {
    const open = this.pos;
    if (depth > GLOB_LIMITS.maxBraceDepth) this.fail('too_complex', open, `braces nested deeper than ${GLOB_LIMITS.maxBraceDepth}`);
    this.pos++;
    const alts: Node[][] = [this.sequence(depth)];
    while (this.peek() === 0x2c) {
      this.pos++;
      alts.push(this.sequence(depth));
    }
    if (this.peek() !== 0x7d) this.fail('syntax', open, 'unclosed {');
    this.pos++;
    if (alts.length === 1) return [{ k: 'lit', cp: 0x7b }, ...alts[0]!, { k: 'lit', cp: 0x7d }];
    this.alternatives += alts.length;
    if (this.alternatives > GLOB_LIMITS.maxAlternatives) this.fail('too_complex', open, `more than ${GLOB_LIMITS.maxAlternatives} brace alternatives`);
    return [{ k: 'alt', alts }];
  }

  private charClass(): CharClass {
    const open = this.pos;
    this.pos++;
    let negated = false;
    if (this.peek() === 0x21 /* ! */ || this.peek() === 0x5e /* ^ */) {
      negated = true;
      this.pos++;
    }
    const ranges: number[] = [];
    let first = true;
    for (;;) {
      let cp = this.peek();
      if (cp === undefined) this.fail('syntax', open, 'unclosed [');
      if (cp === 0x5d /* ] */ && !first) {
        this.pos++;
        break;
      }
      first = false;
      if (cp === 0x5b /* [ */ && this.peek(1) === 0x3a /* : */) {
        const name = this.posixName();
        if (name !== undefined) {
          const set = POSIX_CLASSES[name];
          if (!set) this.fail('syntax', this.pos, `unknown character class [:${name}:]`);
          ranges.push(...set);
          continue;
        }
      }
      if (cp === 0x5c /* \ */) {
        this.pos++;
        cp = this.peek();
        if (cp === undefined) this.fail('syntax', open, 'unclosed [');
      }
      this.pos++;
      let hi = cp;
      if (this.peek() === 0x2d /* - */ && this.peek(1) !== undefined && this.peek(1) !== 0x5d) {
        this.pos++;
        let end = this.peek()!;
        if (end === 0x5c) {
          this.pos++;
          end = this.peek() ?? this.fail('syntax', open, 'unclosed [');
        }
        this.pos++;
        if (end < cp) this.fail('syntax', open, 'character range out of order');
        hi = end;
      }
      ranges.push(cp, hi);
    }
    return { negated, ranges };
  }

  /** `[:name:]` at pos: consumes it and returns the name, or undefined (then it is literal). */
  private posixName(): string | undefined {
    let i = this.pos + 2;
    let name = '';
    while (i < this.cps.length && this.cps[i] !== 0x3a) {
      const c = this.cps[i]!;
      if (c < 0x61 || c > 0x7a) return undefined;
      name += String.fromCodePoint(c);
      i++;
    }
    if (this.cps[i] !== 0x3a || this.cps[i + 1] !== 0x5d || name === '') return undefined;
    this.pos = i + 2;
    return name;
  }
}

function compileNodes(nodes: Node[], prog: Inst[]): void {
  for (const node of nodes) {
    switch (node.k) {
      case 'lit':
        prog.push({ op: 'char', cp: node.cp });
        break;
      case 'any':
        prog.push({ op: 'any' });
        break;
      case 'class':
        prog.push({ op: 'class', cls: node.cls });
        break;
      case 'star':
      case 'all': {
        // L: split L+1, out; L+1: any; jmp L; out:
        const loop = prog.length;
        const split: Inst = { op: 'split', to: [loop + 1, -1] };
        prog.push(split, node.k === 'star' ? { op: 'any' } : { op: 'anyall' }, { op: 'jmp', to: loop });
        split.to[1] = prog.length;
        break;
      }
      case 'dirs': {
        // L: split L+1, out; [^/]* '/'; jmp L; out:
        const loop = prog.length;
        const split: Inst = { op: 'split', to: [loop + 1, -1] };
        prog.push(split);
        compileNodes([{ k: 'star' }, { k: 'lit', cp: SLASH }], prog);
        prog.push({ op: 'jmp', to: loop });
        split.to[1] = prog.length;
        break;
      }
      case 'alt': {
        const split: Inst = { op: 'split', to: [] };
        prog.push(split);
        const jumps: { op: 'jmp'; to: number }[] = [];
        for (const alt of node.alts) {
          split.to.push(prog.length);
          compileNodes(alt, prog);
          const j: { op: 'jmp'; to: number } = { op: 'jmp', to: -1 };
          jumps.push(j);
          prog.push(j);
        }
        for (const j of jumps) j.to = prog.length;
        break;
      }
    }
  }
}

function fold(cp: number): number {
  if (cp < 0x80) return cp >= 0x41 && cp <= 0x5a ? cp + 0x20 : cp;
  const s = String.fromCodePoint(cp);
  const lower = s.toLowerCase();
  return lower.length === s.length ? lower.codePointAt(0)! : cp;
}

function inRanges(r: number[], cp: number): boolean {
  for (let i = 0; i < r.length; i += 2) if (cp >= r[i]! && cp <= r[i + 1]!) return true;
  return false;
}

function inClass(cls: CharClass, cp: number, caseInsensitive: boolean): boolean {
  let hit = inRanges(cls.ranges, cp);
  if (!hit && caseInsensitive) {
    const upper = String.fromCodePoint(cp).toUpperCase();
    hit = inRanges(cls.ranges, fold(cp)) || (upper.length <= 2 && inRanges(cls.ranges, upper.codePointAt(0)!));
  }
  return hit !== cls.negated;
}

/** Opcodes of the lowered program. */
const CHAR = 0;
const ANY = 1;
const ANYALL = 2;
const CLASS = 3;
const SPLIT = 4;
const JMP = 5;
const MATCH = 6;

/** The program as flat arrays, shared by the matchers of one compiled glob. */
interface Program {
  size: number;
  /** Opcode and argument (code point, target, class index or split start) of each state. */
  ops: Uint8Array;
  args: Int32Array;
  /** Split targets: split i's are targets[args[i] .. args[i] + counts[i]). */
  counts: Int32Array;
  targets: Int32Array;
  classes: CharClass[];
  segments: boolean;
  caseInsensitive: boolean;
}

function lower(prog: Inst[], segments: boolean, caseInsensitive: boolean): Program {
  const n = prog.length;
  const ops = new Uint8Array(n);
  const args = new Int32Array(n);
  const counts = new Int32Array(n);
  const classes: CharClass[] = [];
  const targets: number[] = [];
  prog.forEach((inst, i) => {
    switch (inst.op) {
      case 'char':
        ops[i] = CHAR;
        args[i] = caseInsensitive ? fold(inst.cp) : inst.cp;
        break;
      case 'any':
        ops[i] = ANY;
        break;
      case 'anyall':
        ops[i] = ANYALL;
        break;
      case 'class':
        ops[i] = CLASS;
        args[i] = classes.push(inst.cls) - 1;
        break;
      case 'split':
        ops[i] = SPLIT;
        args[i] = targets.length;
        counts[i] = inst.to.length;
        targets.push(...inst.to);
        break;
      case 'jmp':
        ops[i] = JMP;
        args[i] = inst.to;
        break;
      case 'match':
        ops[i] = MATCH;
    }
  });
  return { size: n, ops, args, counts, targets: Int32Array.from(targets), classes, segments, caseInsensitive };
}

/** Pike VM: the set of live NFA states, advanced one code point of the subject at a time. */
class Matcher implements GlobMatcher {
  matched = false;
  steps = 0;
  private subject = '';
  private at = 0;
  private decided = true;
  /** Per-state generation marks, so each state enters a step's set at most once. */
  private readonly mark: Uint32Array;
  private generation = 0;
  private current: Int32Array;
  private next: Int32Array;
  private currentLen = 0;
  private readonly stack: Int32Array;

  constructor(private readonly p: Program) {
    this.mark = new Uint32Array(p.size);
    this.current = new Int32Array(p.size);
    this.next = new Int32Array(p.size);
    // Each state is pushed at most once per incoming edge in one closure.
    this.stack = new Int32Array(p.size + p.targets.length + 1);
  }

  reset(subject: string): void {
    this.subject = subject;
    this.at = 0;
    this.steps = 0;
    this.matched = false;
    this.decided = false;
    // The start set is the ε-closure of state 0.
    const gen = this.nextGeneration();
    this.currentLen = 0;
    this.closure(0, gen, this.current, 0);
    this.currentLen = this.closureLen;
  }

  run(maxSteps: number): boolean {
    if (this.decided) return true;
    const { ops, args, counts, targets, classes, segments, caseInsensitive } = this.p;
    const { mark, stack, subject } = this;
    let { steps, at, current, next, currentLen } = this;
    const limit = steps + maxSteps;
    while (at < subject.length && currentLen > 0) {
      if (steps >= limit) {
        Object.assign(this, { steps, at, current, next, currentLen });
        return false;
      }
      let cp = subject.codePointAt(at)!;
      at += cp > 0xffff ? 2 : 1;
      if (caseInsensitive) cp = fold(cp);
      const gen = this.nextGeneration();
      let nextLen = 0;
      for (let k = 0; k < currentLen; k++) {
        const pc = current[k]!;
        steps++;
        let ok: boolean;
        switch (ops[pc]) {
          case CHAR:
            ok = args[pc] === cp;
            break;
          case ANY:
            ok = !segments || cp !== SLASH;
            break;
          case ANYALL:
            ok = true;
            break;
          case CLASS:
            ok = (!segments || cp !== SLASH) && inClass(classes[args[pc]!]!, cp, caseInsensitive);
            break;
          default:
            ok = false;
        }
        if (!ok) continue;
        // The consumed state moves to pc + 1; its ε-closure joins the next set, in state order.
        let sp = 0;
        stack[sp++] = pc + 1;
        while (sp > 0) {
          const s = stack[--sp]!;
          if (mark[s] === gen) continue;
          mark[s] = gen;
          steps++;
          const op = ops[s]!;
          if (op === JMP) stack[sp++] = args[s]!;
          else if (op === SPLIT) for (let t = args[s]! + counts[s]! - 1; t >= args[s]!; t--) stack[sp++] = targets[t]!;
          else next[nextLen++] = s;
        }
      }
      const swap = current;
      current = next;
      next = swap;
      currentLen = nextLen;
    }
    let matched = false;
    for (let k = 0; k < currentLen && !matched; k++) matched = ops[current[k]!] === MATCH;
    Object.assign(this, { steps, at, current, next, currentLen, matched, decided: true });
    return true;
  }

  private closureLen = 0;

  /** Adds the ε-closure of pc (consuming states and MATCH) to list from index len. */
  private closure(pc: number, gen: number, list: Int32Array, len: number): void {
    const { ops, args, counts, targets } = this.p;
    const { mark, stack } = this;
    let sp = 0;
    stack[sp++] = pc;
    while (sp > 0) {
      const at = stack[--sp]!;
      if (mark[at] === gen) continue;
      mark[at] = gen;
      this.steps++;
      const op = ops[at]!;
      if (op === JMP) stack[sp++] = args[at]!;
      else if (op === SPLIT) for (let t = args[at]! + counts[at]! - 1; t >= args[at]!; t--) stack[sp++] = targets[t]!;
      else list[len++] = at;
    }
    this.closureLen = len;
  }

  private nextGeneration(): number {
    this.generation++;
    if (this.generation === 0xffffffff) {
      this.mark.fill(0);
      this.generation = 1;
    }
    return this.generation;
  }
}

class Glob implements CompiledGlob {
  readonly size: number;
  private readonly program: Program;
  /** Reused by test/measure, which run to completion synchronously. */
  private readonly own: Matcher;

  constructor(
    readonly pattern: string,
    prog: Inst[],
    segments: boolean,
    caseInsensitive: boolean,
  ) {
    this.program = lower(prog, segments, caseInsensitive);
    this.size = this.program.size;
    this.own = new Matcher(this.program);
  }

  test(subject: string): boolean {
    return this.measure(subject).matched;
  }

  measure(subject: string): GlobMatchCost {
    this.own.reset(subject);
    this.own.run(Infinity);
    return { matched: this.own.matched, steps: this.own.steps };
  }

  matcher(): GlobMatcher {
    return new Matcher(this.program);
  }
}

/** Parses and compiles a glob; throws GlobError if it is malformed or too complex. */
export function compileGlob(pattern: string, options: GlobOptions = {}): CompiledGlob {
  if (pattern.length > GLOB_LIMITS.maxPatternLength) {
    throw new GlobError('too_complex', pattern, GLOB_LIMITS.maxPatternLength, `longer than ${GLOB_LIMITS.maxPatternLength} characters`);
  }
  const segments = options.segments ?? true;
  const nodes = new Parser(pattern, segments).parse();
  const prog: Inst[] = [];
  compileNodes(nodes, prog);
  prog.push({ op: 'match' });
  return new Glob(pattern, prog, segments, options.caseInsensitive ?? false);
}

const cache = new Map<string, CompiledGlob>();
const CACHE_SIZE = 256;

/** One-off match with a small cache of compiled patterns; throws GlobError like compileGlob. */
export function matchGlob(pattern: string, subject: string, options: GlobOptions = {}): boolean {
  const key = `${options.segments === false ? 0 : 1}${options.caseInsensitive ? 1 : 0}${pattern}`;
  let glob = cache.get(key);
  if (!glob) {
    glob = compileGlob(pattern, options);
    if (cache.size >= CACHE_SIZE) cache.delete(cache.keys().next().value!);
    cache.set(key, glob);
  }
  return glob.test(subject);
}
