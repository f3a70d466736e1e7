import { readFileSync, readdirSync } from 'node:fs';
import { join } from 'node:path';
import { Redis } from 'ioredis';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ROOT_DIR } from './harness/platform.js';
import { idleCount, SCRIPT, startTurnPlatform, untilEvents, type TurnPlatform } from './harness/turns.js';

/**
 * The Redis keys the platform writes are the ones the documentation lists: after the README's
 * first turn (a Principal, an Environment, a Session, a message, a tool call, an organization-scoped
 * idempotent create), every key in Redis matches a key of docs/*.md (docs/ARCHITECTURE.md's
 * tables and the ones they point to).
 */

/**
 * Every documented key, as a pattern: the backticked `ap:{…}…` strings of the docs, and the `:x`
 * strings that follow one on the same line (read both under its tag and beside its last part:
 * "`ap:{m:<memstore>}:docs`, `:entries`", "`ap:{w:<ws>}:model_usage:total`, `:day:<date>`").
 */
function documentedKeyPatterns(): string[] {
  const out: string[] = [];
  for (const file of readdirSync(join(ROOT_DIR, 'docs')).filter((f) => f.endsWith('.md'))) {
    for (const line of readFileSync(join(ROOT_DIR, 'docs', file), 'utf8').split('\n')) {
      let last: string | undefined;
      for (const m of line.matchAll(/`([^`]+)`/g)) {
        const s = m[1] as string;
        if (s.startsWith('ap:{')) {
          last = s;
          out.push(s);
        } else if (last && (s.startsWith(':') || s.startsWith('…:'))) {
          const rest = s.replace(/^…/, '');
          out.push(`${/^ap:\{[^}]*\}/.exec(last)?.[0] ?? ''}${rest}`, `${last.replace(/:[^:]*$/, '')}${rest}`);
        }
      }
    }
  }
  return out;
}

/**
 * A documented key as a regular expression: `<id>` is any text, `…` and `*` any rest, `[:x]`
 * optional, `{all,live}` and `agents|environments` alternatives.
 */
function keyPattern(doc: string): RegExp {
  const alts: string[][] = [];
  const s = doc
    .replace(/<[^<>]*>/g, '\u0001')
    .replace(/\{([a-z_]+(?:,[a-z_]+)+)\}/g, (_, a: string) => `\u0002${alts.push(a.split(',')) - 1}\u0003`)
    .replace(/[a-z_]+(?:\|[a-z_]+)+/g, (a) => `\u0002${alts.push(a.split('|')) - 1}\u0003`);
  let out = '';
  for (let i = 0; i < s.length; i++) {
    const c = s[i] as string;
    if (c === '\u0001') out += '.+';
    else if (c === '\u0002') {
      const end = s.indexOf('\u0003', i);
      out += `(?:${(alts[Number(s.slice(i + 1, end))] ?? []).join('|')})`;
      i = end;
    } else if (c === '…' || c === '*') out += '.*';
    else if (c === '[') out += '(?:';
    else if (c === ']') out += ')?';
    else out += c.replace(/[.+?^${}()|\\]/g, '\\$&');
  }
  return new RegExp(`^${out}$`);
}

/** A continuation read beside a last part it cuts in two (`[:v<n>]`) is no pattern. */
const patterns = documentedKeyPatterns().flatMap((d) => {
  try {
    return [keyPattern(d)];
  } catch {
    return [];
  }
});
const undocumented = (keys: readonly string[]): string[] => keys.filter((k) => !patterns.some((p) => p.test(k)));

let t: TurnPlatform;
beforeAll(async () => {
  t = await startTurnPlatform({ name: 'redis-keys' });
});
afterAll(async () => {
  await t?.p.stop();
});

describe('Redis keys and the documentation', () => {
  it('the matcher knows a documented key from one the documentation lacks', () => {
    expect(patterns.length).toBeGreaterThan(100);
    expect(undocumented(['ap:{w:wrkspc_1}:idx:sessions:live', 'ap:{s:sess_1}:model_usage:thread:sthr_1', 'ap:{q:rpool_1}:runs:meta'])).toEqual([]);
    expect(undocumented(['ap:{w:wrkspc_1}:not_a_documented_key', 'ap:{o:org_1}:doc_list'])).toHaveLength(2);
  });

  it('after a first turn, every key in Redis is one the documentation lists', async () => {
    const session = await t.api.post<{ id: string }>('/v1/sessions', {
      agent: {
        name: 'keys', model: 'default', tools: [{ type: 'builtin', name: 'bash' }],
        system: SCRIPT([{ when: { user_contains: 'hello' }, then: [{ tool: 'bash', input: { command: 'echo hi' } }] }, { when: { after_tool: 'bash' }, then: [{ reply: 'done' }] }]),
      },
      environment_id: t.envId,
    });
    await t.api.post(`/v1/sessions/${session.id}/events`, t.msg('hello'));
    await untilEvents(t.api, session.id, (e) => idleCount(e) >= 1, 120_000);
    const redis = new Redis(t.p.redisUrl());
    try {
      const keys = await redis.keys('ap:*');
      expect(keys.length).toBeGreaterThan(50);
      // The organization-scoped idempotent create of the harness's developer key, and the Session's turn.
      expect(keys.some((k) => k.startsWith(`ap:{o:${t.p.bootstrap.organization_id}}:idem:`))).toBe(true);
      expect(keys.some((k) => k.startsWith(`ap:{s:${session.id}}:model_usage_step:`))).toBe(true);
      expect(undocumented(keys).sort()).toEqual([]);
    } finally {
      await redis.quit();
    }
  }, 180_000);
});
