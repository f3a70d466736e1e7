import { ApiError } from '@agentplane/core';

/** Authored prompts and expanded prompts are at most this many UTF-8 bytes. */
export const MAX_PROMPT_BYTES = 64 * 1024;

export interface PromptContext {
  event: unknown;
  firing_id: string;
  automation_id: string;
  source: string;
  fired_at: string;
}

const PLACEHOLDER = /\{\{\s*([a-z_]+)((?:\.[A-Za-z0-9_-]+)*)\s*\}\}/g;

function lookup(value: unknown, path: string[]): unknown {
  let v = value;
  for (const p of path) {
    if (typeof v !== 'object' || v === null) return undefined;
    v = (v as Record<string, unknown>)[p];
  }
  return v;
}

/**
 * Expands `{{event}}` (the trigger payload as JSON), `{{event.<a.b>}}` (one member: strings as
 * they are, anything else as JSON, absent as empty), `{{firing_id}}`, `{{automation_id}}`,
 * `{{source}}` and `{{fired_at}}`. Other `{{…}}` stay as written. The result must fit
 * MAX_PROMPT_BYTES (400 `validation.malformed` otherwise).
 */
export function expandPrompt(template: string, ctx: PromptContext): string {
  const out = template.replace(PLACEHOLDER, (whole, name: string, rest: string) => {
    const path = rest ? rest.slice(1).split('.') : [];
    if (name === 'event') {
      const v = lookup(ctx.event, path);
      if (v === undefined) return '';
      // The whole payload is JSON whatever it is (a string payload quoted); one member that is a string goes in as it is.
      return typeof v === 'string' && path.length > 0 ? v : JSON.stringify(v);
    }
    if (path.length > 0) return whole;
    if (name === 'firing_id') return ctx.firing_id;
    if (name === 'automation_id') return ctx.automation_id;
    if (name === 'source') return ctx.source;
    if (name === 'fired_at') return ctx.fired_at;
    return whole;
  });
  if (Buffer.byteLength(out, 'utf8') > MAX_PROMPT_BYTES) {
    throw new ApiError('validation.malformed', `the prompt after {{event}} expansion exceeds ${MAX_PROMPT_BYTES} bytes`);
  }
  if (out.trim().length === 0) throw new ApiError('validation.malformed', 'the prompt is empty after expansion');
  return out;
}
