import { describe, expect, it } from 'vitest';
import { apiUrl } from './url.js';

describe('apiUrl', () => {
  it('keeps a base path, with or without a trailing slash', () => {
    expect(apiUrl('https://host/agentplane', '/v1/runner-pairings/redeem').toString()).toBe('https://host/agentplane/v1/runner-pairings/redeem');
    expect(apiUrl('https://host/agentplane/', '/v1/x').toString()).toBe('https://host/agentplane/v1/x');
    expect(apiUrl('https://host/a/b', 'v1/x').toString()).toBe('https://host/a/b/v1/x');
  });

  it('works on a bare origin and keeps the query of the path', () => {
    expect(apiUrl('http://127.0.0.1:8080', '/healthz').toString()).toBe('http://127.0.0.1:8080/healthz');
    expect(apiUrl('http://127.0.0.1:8080/', '/v1/x?limit=2').toString()).toBe('http://127.0.0.1:8080/v1/x?limit=2');
  });
});
