import { RUNNER_DEFAULTS, type ContentBlock, type ModelMessage } from '@agentplane/protocol';
import type { Responses } from './history.js';

/**
 * What a turn spec's conversation may weigh. The spec reaches the runner in one frame of the
 * runner protocol (at most `RUNNER_DEFAULTS.maxFrameBytes`, 1 MiB: a larger one closes the
 * runner's connection, and every lease on it with it), and the harness sends the history again
 * in its model requests, which the same bound holds. A drive event may carry up to 4 MiB of text,
 * and answers and queued messages add up: the spec is fitted here, whatever the log holds.
 */
export const SPEC_BUDGET = {
  /** The conversation: the newest messages that fit, the newest one cut to fit when it alone does not. */
  historyBytes: 512 * 1024,
  /** The answers to blocking tool uses this turn resolves, shared among them. */
  responsesBytes: 256 * 1024,
  /** The whole spec as the runner reads it: what is left of a frame for the offer around it. */
  specBytes: RUNNER_DEFAULTS.maxFrameBytes - 64 * 1024,
} as const;

const bytes = (s: string): number => Buffer.byteLength(s, 'utf8');
const jsonBytes = (v: unknown): number => bytes(JSON.stringify(v));

/** The longest start of `text` of at most `maxBytes` UTF-8 bytes (never half a character). */
function startOf(text: string, maxBytes: number): string {
  if (maxBytes <= 0) return '';
  const b = Buffer.from(text, 'utf8');
  if (b.length <= maxBytes) return text;
  let end = maxBytes;
  // Back to the first byte of the character the cut falls in.
  while (end > 0 && ((b[end] ?? 0) & 0xc0) === 0x80) end--;
  return b.subarray(0, end).toString('utf8');
}

/** `text` cut to about `maxBytes` of JSON, with a note of what was left out that the model reads. */
export function cutText(text: string, maxBytes: number, what: string): string {
  const size = jsonBytes(text);
  if (size <= maxBytes) return text;
  // JSON escapes make a text heavier than its bytes: cut in proportion.
  const keep = startOf(text, Math.floor((Math.max(0, maxBytes - 160) * bytes(text)) / size));
  return `${keep}\n\n[agentplane: the rest of this ${what} (${bytes(text) - bytes(keep)} of its ${bytes(text)} bytes) was cut so that the turn fits its size limit]`;
}

type TextBearing = { i: number; size: number };

/** Each text of a message cut to its share of `maxBytes` (a text under its share leaves the rest to the others). */
function shareOut(m: ModelMessage, maxBytes: number): ModelMessage {
  const texts: TextBearing[] = [];
  m.content.forEach((b, i) => {
    if (b.type === 'text' || b.type === 'thinking') texts.push({ i, size: jsonBytes(b.text) });
    else if (b.type === 'tool_result') texts.push({ i, size: jsonBytes(b.content) });
  });
  const fixed = jsonBytes({ ...m, content: m.content.map((b) => (b.type === 'text' || b.type === 'thinking' ? { ...b, text: '' } : b.type === 'tool_result' ? { ...b, content: '' } : b)) });
  let left = Math.max(0, maxBytes - fixed);
  const share = new Map<number, number>();
  const ascending = [...texts].sort((a, b) => a.size - b.size);
  ascending.forEach((t, k) => {
    const fair = Math.floor(left / (ascending.length - k));
    const given = Math.min(t.size, fair);
    share.set(t.i, given);
    left -= given;
  });
  const content = m.content.map((b, i): ContentBlock => {
    const s = share.get(i);
    if (s === undefined) return b;
    if (b.type === 'text' || b.type === 'thinking') return { ...b, text: cutText(b.text, s, 'message') };
    if (b.type === 'tool_result') return { ...b, content: cutText(b.content, s, 'tool result') };
    return b;
  });
  return { ...m, content };
}

/** Below this share a cut text would be mostly its note: the message keeps whole parts instead. */
const MIN_SHARE_BYTES = 1024;

/**
 * A message of more than `maxBytes` cut to fit. Each of its texts keeps a share, noting what was
 * left out; when the shares would be too small to say anything (many parts: a turn that took
 * thousands of queued messages), the message keeps its newest parts whole instead, the newest
 * that does not fit cut to what is left, and one note says how many earlier parts were left
 * out. Its tool results are always kept (a provider pairs each with its tool use), cut short when
 * needed. What comes back never weighs more than `maxBytes` unless its tool results alone do.
 */
function cutMessage(m: ModelMessage, maxBytes: number): ModelMessage {
  const parts = m.content.filter((b) => b.type === 'text' || b.type === 'thinking' || b.type === 'tool_result').length;
  if (parts > 0 && maxBytes / parts >= MIN_SHARE_BYTES) {
    let budget = maxBytes;
    for (;;) {
      const cut = shareOut(m, budget);
      // The notes and the escapes' rounding weigh a little: a tighter share until it fits.
      if (jsonBytes(cut) <= maxBytes) return cut;
      if (budget / parts < MIN_SHARE_BYTES) break;
      budget = Math.floor(budget * 0.9);
    }
  }
  return newestParts(m, maxBytes);
}

/** The note that stands for the first `n` parts of a message, left out. */
const partsLeftOut = (n: number, size: number): ContentBlock => ({
  type: 'text',
  text: `[agentplane: the first ${n} part${n === 1 ? '' : 's'} of this message (${size} bytes) ${n === 1 ? 'was' : 'were'} left out so that the turn fits its size limit]`,
});

/** `m`'s newest parts within `maxBytes` (see `cutMessage`). */
function newestParts(m: ModelMessage, maxBytes: number): ModelMessage {
  const results = m.content.flatMap((b) => (b.type === 'tool_result' ? [b] : []));
  const others = m.content.filter((b) => b.type !== 'tool_result');
  const resultShare = results.length > 0 ? Math.max(MIN_SHARE_BYTES / 4, Math.floor(maxBytes / 4 / results.length)) : 0;
  const kept: ContentBlock[] = results.map((b) => ({ ...b, content: cutText(b.content, resultShare, 'tool result') }));
  // What the message weighs without its other parts, its note written with the largest numbers it can hold.
  let left = maxBytes - jsonBytes({ ...m, content: [...kept, partsLeftOut(others.length, Number.MAX_SAFE_INTEGER)] });
  const newest: ContentBlock[] = [];
  let i = others.length - 1;
  for (; i >= 0 && left > 0; i--) {
    const b = others[i] as ContentBlock;
    const n = jsonBytes(b) + 1; // and its comma
    if (n <= left) {
      newest.unshift(b);
      left -= n;
      continue;
    }
    // The newest part that does not fit whole keeps what is left of the budget, when that says something.
    if ((b.type === 'text' || b.type === 'thinking') && left - 64 >= MIN_SHARE_BYTES) {
      newest.unshift({ ...b, text: cutText(b.text, left - 64, 'message') });
      i--;
    }
    break;
  }
  const dropped = others.slice(0, i + 1);
  const note = dropped.length > 0 ? [partsLeftOut(dropped.length, dropped.reduce((n, b) => n + jsonBytes(b), 0))] : [];
  return { ...m, content: [...kept, ...note, ...newest] };
}

/**
 * The newest messages of a conversation within `maxBytes` of JSON: the older ones are left out
 * (the first kept message says how many, so the model knows the conversation began earlier),
 * and a newest message heavier than the whole budget is cut to fit.
 */
export function fitHistory(history: readonly ModelMessage[], maxBytes: number = SPEC_BUDGET.historyBytes): ModelMessage[] {
  let size = 0;
  const kept: ModelMessage[] = [];
  for (let i = history.length - 1; i >= 0; i--) {
    const m = history[i] as ModelMessage;
    const n = jsonBytes(m);
    if (size + n > maxBytes && kept.length > 0) break;
    size += n;
    kept.unshift(m);
  }
  // A conversation must start with a user turn.
  while (kept.length > 1 && kept[0]?.role !== 'user') kept.shift();
  if (kept.length === 1 && size > maxBytes) kept[0] = cutMessage(kept[0] as ModelMessage, maxBytes - 256);
  const left = history.length - kept.length;
  const first = kept[0];
  if (left > 0 && first) {
    const note: ContentBlock = { type: 'text', text: `[agentplane: the ${left} earlier message${left === 1 ? '' : 's'} of this conversation ${left === 1 ? 'was' : 'were'} left out so that the turn fits its size limit]` };
    // Tool results lead a message that has them (as providers require); a note goes after them.
    kept[0] = { ...first, content: first.content[0]?.type === 'tool_result' ? [...first.content, note] : [note, ...first.content] };
  }
  return kept;
}

/** The answers a turn resolves, each cut to its share of `maxBytes` when together they are heavier. */
export function fitResponses(responses: Responses, maxBytes: number = SPEC_BUDGET.responsesBytes): Responses {
  const texts = [
    ...Object.values(responses.custom_tool_results),
    ...Object.values(responses.question_answers),
  ];
  const total = texts.reduce((n, t) => n + jsonBytes(t.content), 0);
  if (total <= maxBytes) return responses;
  const share = Math.floor(maxBytes / texts.length);
  const cut = <T extends { content: string }>(r: Record<string, T>, what: string): Record<string, T> =>
    Object.fromEntries(Object.entries(r).map(([id, t]) => [id, { ...t, content: cutText(t.content, share, what) }]));
  return {
    custom_tool_results: cut(responses.custom_tool_results, 'tool result'),
    confirmations: responses.confirmations,
    question_answers: cut(responses.question_answers, 'answer'),
  };
}

/** Thrown when a spec is heavier than a runner frame takes even with its conversation fitted (a huge system prompt). */
export class SpecTooLarge extends Error {
  constructor(readonly sizeBytes: number) {
    super(`the turn spec is ${sizeBytes} bytes, over the ${SPEC_BUDGET.specBytes} a runner frame takes (the agent's system prompt and tools weigh the most)`);
    this.name = 'SpecTooLarge';
  }
}

/** The spec itself, checked against what a frame takes (one serialisation of a few KiB per Run in the usual case). */
export function checkSpecSize(spec: unknown, size: number = specBytesOf(spec)): void {
  if (size > SPEC_BUDGET.specBytes) throw new SpecTooLarge(size);
}

/** What a spec weighs in a frame (its JSON's UTF-8 bytes). */
export function specBytesOf(spec: unknown): number {
  return jsonBytes(spec);
}
