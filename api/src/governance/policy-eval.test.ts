import { describe, expect, it } from 'vitest';
import { GlobError } from '@agentplane/core';
import { namesFileTool, PolicySet, type PolicyRule } from './policy-eval.js';

let n = 0;
const rule = (r: Partial<PolicyRule> & Pick<PolicyRule, 'effect'>): PolicyRule => ({
  id: `apol_${String(++n).padStart(32, '0')}`, tool_kind: 'builtin', tool_name: 'bash', created_at: new Date(1_700_000_000_000 + n).toISOString(), ...r,
});
const bash = (command: string, principal_id?: string) => ({ kind: 'builtin' as const, name: 'bash', input: { command }, ...(principal_id ? { principal_id } : {}) });

describe('ActionPolicy evaluation', () => {
  it('allows by default when nothing matches', () => {
    const d = new PolicySet([]).evaluate(bash('ls'));
    expect(d).toMatchObject({ decision: 'allow', rule_id: null, matched: [] });
  });

  it('deny wins over any allow, however specific', () => {
    const deny = rule({ effect: 'deny' });
    const allow = rule({ effect: 'allow', command_prefix: 'git status', principal_id: 'prin_a' });
    const d = new PolicySet([allow, deny]).evaluate(bash('git status', 'prin_a'));
    expect(d.decision).toBe('deny');
    expect(d.rule_id).toBe(deny.id);
    expect(d.matched.map((m) => m.rule_id)).toEqual([allow.id, deny.id]);
    expect(d.explanation).toContain(deny.id);
  });

  it('otherwise the most specific match decides; ties go to require_approval, then the oldest rule', () => {
    const approve = rule({ effect: 'require_approval' });
    const allowGit = rule({ effect: 'allow', command_prefix: 'git status' });
    const set = new PolicySet([approve, allowGit]);
    expect(set.evaluate(bash('git status --short'))).toMatchObject({ decision: 'allow', rule_id: allowGit.id });
    expect(set.evaluate(bash('rm -rf /'))).toMatchObject({ decision: 'require_approval', rule_id: approve.id });
    const allowSame = rule({ effect: 'allow' });
    expect(new PolicySet([allowSame, approve]).evaluate(bash('ls'))).toMatchObject({ decision: 'require_approval', rule_id: approve.id });
    const first = rule({ effect: 'allow', tool_name: 'ba*' });
    const second = rule({ effect: 'allow', tool_name: 'b*' });
    expect(new PolicySet([second, first]).evaluate(bash('ls')).rule_id).toBe(first.id);
  });

  it('a command prefix matches on a word boundary, and never allows a command with shell control characters', () => {
    const allow = rule({ effect: 'allow', command_prefix: 'git status' });
    const approve = rule({ effect: 'require_approval' });
    const set = new PolicySet([allow, approve]);
    expect(set.evaluate(bash('git statusx')).decision).toBe('require_approval');
    expect(set.evaluate(bash('git status; rm -rf /')).decision).toBe('require_approval');
    expect(set.evaluate(bash('git status && curl x')).decision).toBe('require_approval');
    expect(set.evaluate(bash('  git status')).decision).toBe('allow');
    const denyRm = rule({ effect: 'deny', command_prefix: 'rm' });
    expect(new PolicySet([denyRm]).evaluate(bash('rm -rf / && echo')).decision).toBe('deny');
  });

  it('a deny or approval prefix matches every simple command of the line, wherever a shell ends the word', () => {
    const denyRm = new PolicySet([rule({ effect: 'deny', command_prefix: 'rm' })]);
    for (const c of ['rm;ls', 'rm${IFS}/workspace/victim;ls', 'rm&&x', 'rm|x', 'rm>x', 'rm$x', 'rm(', ';rm x', 'ls && rm -rf /', 'echo $(rm x)', 'echo `rm x`', 'a | rm', '(rm x)', 'rm"" x', "rm'' x", 'x\nrm y']) {
      expect(denyRm.evaluate(bash(c)).decision, c).toBe('deny');
    }
    for (const c of ['rmdir x', 'echo rm', 'ls -la', 'firm x']) expect(denyRm.evaluate(bash(c)).decision, c).toBe('allow');
    const approveEcho = new PolicySet([rule({ effect: 'require_approval', command_prefix: 'echo' })]);
    expect(approveEcho.evaluate(bash('echo;id')).decision).toBe('require_approval');
    expect(approveEcho.evaluate(bash('echo${IFS}x')).decision).toBe('require_approval');
    // An allow prefix is as strict as before.
    const allowLs = new PolicySet([rule({ effect: 'allow', command_prefix: 'ls' }), rule({ effect: 'require_approval' })]);
    expect(allowLs.evaluate(bash('ls -la')).decision).toBe('allow');
    expect(allowLs.evaluate(bash('ls;rm x')).decision).toBe('require_approval');
  });

  it('a path rule sees relative paths as the workspace\'s, and a search above the paths a deny names', () => {
    const secrets = rule({ effect: 'deny', tool_kind: 'builtin', tool_name: '*', path_glob: '/workspace/secrets/**' });
    const set = new PolicySet([secrets]);
    const file = (name: string, input: Record<string, unknown>) => set.evaluate({ kind: 'builtin', name, input }).decision;
    for (const p of ['/workspace/secrets/k', 'secrets/k', './secrets/k', 'x/../secrets/k', '/workspace//secrets/./k']) expect(file('read', { path: p }), p).toBe('deny');
    expect(file('read', { path: 'public/k' })).toBe('allow');
    // A search of the workspace (its default) or of a directory above the secrets reaches them.
    expect(file('grep', { pattern: 'key' })).toBe('deny');
    expect(file('grep', { pattern: 'key', path: '/workspace' })).toBe('deny');
    expect(file('glob', { pattern: '**/*', path: '.' })).toBe('deny');
    expect(file('grep', { pattern: 'key', path: 'public' })).toBe('allow');
    // A listing shows names: one that can show a name the deny covers is denied (the directory
    // itself, or one above it listed deep enough), one that shows only names outside is not.
    expect(file('list', {})).toBe('allow');
    expect(file('list', { path: '/workspace', depth: 1 })).toBe('allow');
    expect(file('list', { path: 'secrets' })).toBe('deny');
    expect(file('list', { path: '/workspace/secrets/' })).toBe('deny');
    expect(file('list', { path: 'secrets/inner' })).toBe('deny');
    expect(file('list', { depth: 2 })).toBe('deny');
    expect(file('list', { path: '/', depth: 2 })).toBe('allow');
    expect(file('list', { path: '/', depth: 3 })).toBe('deny');
    expect(file('list', { path: 'public', depth: 5 })).toBe('allow');
    const rootWide = new PolicySet([rule({ effect: 'deny', tool_kind: 'builtin', tool_name: 'list', path_glob: '/workspace/*.key' })]);
    expect(rootWide.evaluate({ kind: 'builtin', name: 'list', input: {} }).decision).toBe('deny');
    expect(rootWide.evaluate({ kind: 'builtin', name: 'list', input: { path: '/' } }).decision).toBe('allow');
    // An allow rule is matched by the path reached, and never by a search above it.
    const allowPublic = new PolicySet([rule({ effect: 'allow', tool_kind: 'builtin', tool_name: '*', path_glob: '/workspace/public/**' }), rule({ effect: 'require_approval', tool_kind: 'builtin', tool_name: '*' })]);
    expect(allowPublic.evaluate({ kind: 'builtin', name: 'read', input: { path: 'public/a' } }).decision).toBe('allow');
    expect(allowPublic.evaluate({ kind: 'builtin', name: 'grep', input: { pattern: 'x' } }).decision).toBe('require_approval');
  });

  it('matches names by glob, kinds, connections, Principals and file paths', () => {
    const mcp = rule({ effect: 'deny', tool_kind: 'mcp', tool_name: 'github_*', connection_id: 'conn_1' });
    const files = rule({ effect: 'deny', tool_kind: 'builtin', tool_name: '{write,edit}', path_glob: '/etc/**' });
    const mine = rule({ effect: 'require_approval', tool_kind: 'any', tool_name: '*', principal_id: 'prin_x' });
    const set = new PolicySet([mcp, files, mine]);
    expect(set.evaluate({ kind: 'mcp', name: 'github_push', connection_id: 'conn_1' }).rule_id).toBe(mcp.id);
    expect(set.evaluate({ kind: 'mcp', name: 'github_push', connection_id: 'conn_2' }).decision).toBe('allow');
    expect(set.evaluate({ kind: 'custom', name: 'github_push' }).decision).toBe('allow');
    expect(set.evaluate({ kind: 'builtin', name: 'write', input: { path: '/etc/passwd', content: '' } }).decision).toBe('deny');
    expect(set.evaluate({ kind: 'builtin', name: 'write', input: { path: '/workspace/a' } }).decision).toBe('allow');
    expect(set.evaluate({ kind: 'builtin', name: 'read', input: { path: '/etc/passwd' } }).decision).toBe('allow');
    expect(set.evaluate({ kind: 'drive', name: 'user.message', principal_id: 'prin_x' }).decision).toBe('require_approval');
    expect(set.evaluate({ kind: 'drive', name: 'user.message', principal_id: 'prin_y' }).decision).toBe('allow');
  });

  it('name patterns with literal heads and tails, classes and alternatives', () => {
    const cases: [string, string, boolean][] = [
      ['*_x', 'a_x', true], ['*_x', 'a_y', false], ['*_x', '_x', true],
      ['pre{a,b}post', 'preapost', true], ['pre{a,b}post', 'precpost', false],
      ['ab*ba', 'aba', false], ['ab*ba', 'abba', true], ['[gs]et_*', 'set_x', true], ['[gs]et_*', 'let_x', false],
      ['a,b*', 'a,bc', true], ['{a}', '{a}', true], ['x?', 'xy', true], ['x?', 'x', false],
    ];
    for (const [pattern, name, hit] of cases) {
      const d = new PolicySet([rule({ effect: 'deny', tool_kind: 'custom', tool_name: pattern })]).evaluate({ kind: 'custom', name });
      expect([pattern, name, d.decision]).toEqual([pattern, name, hit ? 'deny' : 'allow']);
    }
  });

  it('refuses malformed patterns, and stays linear on hostile ones', () => {
    expect(() => new PolicySet([rule({ effect: 'deny', tool_name: 'a[' })])).toThrow(GlobError);
    const hostile = rule({ effect: 'deny', tool_kind: 'any', tool_name: `${'*a'.repeat(40)}b` });
    const started = Date.now();
    const d = new PolicySet([hostile]).evaluate({ kind: 'custom', name: 'a'.repeat(250) });
    expect(d.decision).toBe('allow');
    expect(Date.now() - started).toBeLessThan(1000);
  });

  it('knows which tool names a path pattern can apply to', () => {
    for (const name of ['read', 'grep', '{write,edit}', 'wr*', '*', '?ist', 'a[']) expect([name, namesFileTool(name)]).toEqual([name, true]);
    for (const name of ['bash', 'ba*', '{bash,web_fetch}', 'readme']) expect([name, namesFileTool(name)]).toEqual([name, false]);
  });
});
