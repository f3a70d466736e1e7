import { describe, expect, it } from 'vitest';
import { ApiError } from '@agentplane/core';
import { matchCovers, normaliseMatch } from './service.js';

describe('vault secret match', () => {
  it('covers the same origin at or below the path, on segment boundaries', () => {
    const m = normaliseMatch('https://git.example.com/org/', 'git_https');
    expect(m).toBe('https://git.example.com/org');
    expect(matchCovers(m, 'https://git.example.com/org')).toBe(true);
    expect(matchCovers(m, 'https://git.example.com/org/repo.git')).toBe(true);
    expect(matchCovers(m, 'https://git.example.com/organisation/repo.git')).toBe(false);
    expect(matchCovers(m, 'https://git.example.com:8443/org/repo.git')).toBe(false);
    expect(matchCovers(m, 'http://git.example.com/org/repo.git')).toBe(false);
    expect(matchCovers(m, 'https://evil.example.com/org/repo.git')).toBe(false);
    expect(matchCovers(m, 'not a url')).toBe(false);
    expect(matchCovers(normaliseMatch('https://git.example.com', 'git_https'), 'https://git.example.com/any/thing')).toBe(true);
  });

  it('refuses credentials, queries, fragments and plain http for git', () => {
    for (const bad of ['https://u:p@h.example.com', 'https://h.example.com/?q=1', 'https://h.example.com/#x', 'ftp://h.example.com', 'nope']) {
      expect(() => normaliseMatch(bad, 'mcp_bearer'), bad).toThrow(ApiError);
    }
    expect(() => normaliseMatch('http://h.example.com', 'git_https')).toThrow(ApiError);
    expect(normaliseMatch('http://127.0.0.1:9000/mcp', 'mcp_bearer')).toBe('http://127.0.0.1:9000/mcp');
  });
});
