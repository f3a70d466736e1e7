/**
 * The platform Outcome grader's pure parts: what the grader is told (its instructions, the
 * rubric, the description and the artifact) and how its answer becomes a verdict. The grader
 * runs in a context of its own: the agent's reasoning and tool transcript are never part of it.
 * Used by outcomes (this folder) and meant for every other grading caller (skill verification,
 * automation outcomes): they build a `GraderContext`, start a grader Run, and read the verdict
 * with `parseVerdict` (docs/OUTCOMES.md).
 */
import type { GraderRunResult } from '../sessions/model.js';

export const GRADER_LIMITS = {
  /** Rubric text (inline or from a File), in bytes. */
  rubricBytes: 64 * 1024,
  /** The agent's final message, in characters. */
  finalMessageChars: 64 * 1024,
  /** Workspace files named in the final message that the grader reads. */
  maxFiles: 8,
  fileBytes: 32 * 1024,
  filesTotalBytes: 128 * 1024,
  /** Criteria taken from a rubric. */
  maxCriteria: 32,
  /** What a grader Run's report may carry back (its input and output), in bytes. */
  reportBytes: 512 * 1024,
} as const;

export type Verdict = 'satisfied' | 'needs_revision' | 'failed';

export interface CriterionVerdict {
  criterion: string;
  verdict: 'pass' | 'fail';
  explanation: string | null;
}

export interface GraderVerdict {
  result: Verdict;
  criteria: CriterionVerdict[];
  /** For `needs_revision`: what to change, one line per failing criterion; the next turn's input. */
  explanation: string;
}

/** What the grader sees; nothing else of the Session reaches it. */
export interface GraderContext {
  description: string;
  rubric: string;
  finalMessage: string;
  iteration: number;
  maxIterations: number;
}

/** What a grader Run's runner needs: the request text and the workspace files to append. */
export interface GraderSpec {
  system: string;
  prompt: string;
  paths: string[];
  limits: { file_bytes: number; files_total_bytes: number };
}

export const GRADER_INSTRUCTIONS = [
  'You are the outcome grader. You judge whether an agent\'s work meets an outcome, using only the',
  'outcome description, the rubric below and the artifact you are shown (the agent\'s final message and',
  'the workspace files it names). Score every rubric criterion as pass or fail. Answer with one JSON',
  'object and nothing else:',
  '{"result": "satisfied" | "needs_revision" | "failed",',
  ' "criteria": [{"criterion": "<criterion>", "verdict": "pass" | "fail", "explanation": "<why>"}],',
  ' "explanation": "<what the agent must change, one line per failing criterion>"}',
  'Use "satisfied" when every criterion passes, "needs_revision" when another attempt can fix the',
  'failures, and "failed" when the outcome cannot be reached.',
].join('\n');

/** The criteria of a rubric: its list items (outside code fences); the whole rubric when it has none. */
export function rubricCriteria(rubric: string): string[] {
  const out: string[] = [];
  let fenced = false;
  for (const line of rubric.split('\n')) {
    if (/^\s*```/.test(line)) {
      fenced = !fenced;
      continue;
    }
    if (fenced) continue;
    const m = /^\s*(?:[-*+]|\d{1,3}[.)])\s+(.+?)\s*$/.exec(line);
    if (m?.[1]) out.push(m[1].slice(0, 500));
    if (out.length >= GRADER_LIMITS.maxCriteria) break;
  }
  return out.length > 0 ? out : ['The rubric as a whole'];
}

/**
 * Workspace paths the final message names: backtick-quoted tokens, and bare tokens that look like
 * a relative path with an extension (`notes/plan.md`). URLs and absolute paths outside the
 * workspace root are ignored; at most `maxFiles`, first mention first.
 */
export function namedPaths(message: string): string[] {
  const found: string[] = [];
  const add = (raw: string) => {
    const p = raw.replace(/^\.\//, '').replace(/[.,;:!?)]+$/, '');
    if (!p || p.includes('://') || p.includes('..') || /\s/.test(p) || p.length > 512) return;
    if (p.startsWith('/') && !p.startsWith('/workspace/')) return;
    if (!/^[\w./@+-]+$/.test(p) || !/\.[A-Za-z0-9]{1,10}$/.test(p)) return;
    if (!found.includes(p)) found.push(p);
  };
  for (const m of message.matchAll(/`([^`\n]{1,512})`/g)) if (m[1]) add(m[1]);
  for (const m of message.matchAll(/(?:^|[\s(])((?:\.\/|\/workspace\/)?[\w@+-]+(?:\/[\w.@+-]+)*\.[A-Za-z0-9]{1,10})(?=$|[\s.,;:!?)])/gm)) if (m[1]) add(m[1]);
  return found.slice(0, GRADER_LIMITS.maxFiles);
}

export function graderSpec(ctx: GraderContext, routingKey: string): GraderSpec & { routing_key: string } {
  const finalMessage = ctx.finalMessage.length > GRADER_LIMITS.finalMessageChars
    ? `${ctx.finalMessage.slice(0, GRADER_LIMITS.finalMessageChars)}\n… [truncated]`
    : ctx.finalMessage;
  return {
    routing_key: routingKey,
    system: `${GRADER_INSTRUCTIONS}\n\n# Rubric\n\n${ctx.rubric}`,
    prompt: [
      `# Outcome\n\n${ctx.description}`,
      `# Evaluation\n\nEvaluation ${ctx.iteration} of at most ${ctx.maxIterations}.`,
      `# The agent's final message\n\n${finalMessage || '(the agent sent no message)'}`,
    ].join('\n\n'),
    paths: namedPaths(ctx.finalMessage),
    limits: { file_bytes: GRADER_LIMITS.fileBytes, files_total_bytes: GRADER_LIMITS.filesTotalBytes },
  };
}

function jsonObjectIn(text: string): unknown {
  const fenced = /```(?:json)?\s*\n([\s\S]*?)```/.exec(text);
  const candidates = [fenced?.[1], text.slice(text.indexOf('{'), text.lastIndexOf('}') + 1)];
  for (const c of candidates) {
    if (!c || !c.trim().startsWith('{')) continue;
    try {
      return JSON.parse(c);
    } catch {
      // try the next candidate
    }
  }
  return null;
}

/**
 * The grader's answer as a verdict, or null when it is not one. Criteria the grader left out are
 * reported as failing for a `needs_revision` and passing for a `satisfied` verdict; an answer
 * without an explanation gets one made of its failing criteria.
 */
export function parseVerdict(text: string, criteria: string[]): GraderVerdict | null {
  const obj = jsonObjectIn(text) as Record<string, unknown> | null;
  if (!obj || typeof obj !== 'object') return null;
  const result = obj.result;
  if (result !== 'satisfied' && result !== 'needs_revision' && result !== 'failed') return null;
  const given = Array.isArray(obj.criteria) ? (obj.criteria as unknown[]) : [];
  const scored: CriterionVerdict[] = [];
  for (const g of given.slice(0, GRADER_LIMITS.maxCriteria)) {
    if (!g || typeof g !== 'object') continue;
    const r = g as Record<string, unknown>;
    const name = typeof r.criterion === 'string' ? r.criterion.slice(0, 500) : null;
    if (!name || (r.verdict !== 'pass' && r.verdict !== 'fail')) continue;
    scored.push({ criterion: name, verdict: r.verdict, explanation: typeof r.explanation === 'string' ? r.explanation.slice(0, 4000) : null });
  }
  for (const c of criteria) {
    if (!scored.some((s) => s.criterion === c)) scored.push({ criterion: c, verdict: result === 'satisfied' ? 'pass' : 'fail', explanation: null });
  }
  const failing = scored.filter((s) => s.verdict === 'fail');
  const given_explanation = typeof obj.explanation === 'string' ? obj.explanation.slice(0, 16_384).trim() : '';
  const explanation = given_explanation
    || failing.map((f) => `- ${f.criterion}${f.explanation ? `: ${f.explanation}` : ''}`).join('\n')
    || (result === 'satisfied' ? 'Every criterion passes.' : 'The grader gave no explanation.');
  return { result, criteria: scored, explanation };
}

/** A runner's grader report, checked and bounded before it is stored on the Run; null if malformed. */
export function boundedGraderResult(raw: unknown): GraderRunResult | undefined {
  if (!raw || typeof raw !== 'object') return undefined;
  const r = raw as Record<string, unknown>;
  const input = r.input as Record<string, unknown> | undefined;
  if (typeof r.output !== 'string' || !input || typeof input.system !== 'string' || !Array.isArray(input.messages)) return undefined;
  const usage = r.usage && typeof r.usage === 'object'
    ? Object.fromEntries(Object.entries(r.usage as Record<string, unknown>).filter((e): e is [string, number] => typeof e[1] === 'number'))
    : null;
  const out: GraderRunResult = { input: { system: input.system, messages: input.messages }, output: r.output.slice(0, 64 * 1024), usage };
  return Buffer.byteLength(JSON.stringify(out)) <= GRADER_LIMITS.reportBytes ? out : { ...out, input: { system: out.input.system.slice(0, 64 * 1024), messages: [] } };
}
