import { describe, expect, it } from 'vitest';
import { RUNNER_EXIT } from '@agentplane/protocol';
import { classify, credentialRefused, requestFailure } from './cli-errors.js';

const errno = (code: string): Error => Object.assign(new Error(`${code}: something, open '/somewhere/runner.json.1.tmp'`), { code, syscall: 'open' });

describe('runner CLI error types', () => {
  it.each(['ENOSPC', 'EROFS', 'EACCES', 'ENOENT', 'ENOTDIR', 'EISDIR', 'EPERM', 'EDQUOT'])('%s from the filesystem is a config error (exit code 2)', (code) => {
    expect(classify(errno(code))).toEqual({ type: 'config', message: errno(code).message, code: 2, detail: { code } });
  });

  it('a socket error is still a network error (exit code 1)', () => {
    expect(classify(Object.assign(new Error('connect ECONNRESET'), { code: 'ECONNRESET' }))).toMatchObject({ type: 'network', code: 1 });
    const fetchFailed = Object.assign(new TypeError('fetch failed'), { cause: { code: 'ECONNREFUSED' } });
    expect(classify(fetchFailed)).toMatchObject({ type: 'network', code: 1, message: 'fetch failed: ECONNREFUSED' });
  });

  it('a certificate this machine does not trust says how to trust a private CA', () => {
    for (const code of ['DEPTH_ZERO_SELF_SIGNED_CERT', 'UNABLE_TO_VERIFY_LEAF_SIGNATURE']) {
      const err = requestFailure(Object.assign(new TypeError('fetch failed'), { cause: { code } }), 'pair failed', 'https://cp.example/v1/runner-pairings/redeem', 30_000);
      expect(classify(err)).toMatchObject({ type: 'network', code: 1, detail: { url: 'https://cp.example/v1/runner-pairings/redeem', cause: code } });
      expect(err.message).toContain('https://cp.example/v1/runner-pairings/redeem');
      expect(err.message).toContain(code);
      expect(err.message).toContain('NODE_EXTRA_CA_CERTS');
    }
  });

  it('a timeout names the URL and the bound', () => {
    const err = requestFailure(new DOMException('The operation was aborted due to timeout', 'TimeoutError'), 'enroll failed', 'http://cp:8080/v1/x', 30_000);
    expect(err.message).toContain('no answer from http://cp:8080/v1/x within 30 s');
    expect(classify(err)).toMatchObject({ type: 'network', code: 1 });
  });

  it('a credential the control plane refused for good is its own type and exit code (5), said in one line with what to do', () => {
    const cred = {
      base_url: 'https://cp.example', secret: 'ap_runner_x', runner_id: 'runner_1', runner_credential_id: 'rcred_1', runner_pool_id: 'rpool_1',
      workspace_id: 'wksp_1', machine_label: 'box', paired_at: '2026-01-01T00:00:00.000Z',
    };
    const refused = { http_status: 401 as const, error_type: 'auth.invalid_key', error_message: 'unknown or revoked credential', at: '2026-01-02T00:00:00.000Z' };
    const c = classify(credentialRefused(refused, cred, '/srv/runner'));
    expect(RUNNER_EXIT.credentialRefused).toBe(5);
    expect(c).toMatchObject({
      type: 'credential_refused', code: 5,
      detail: { http_status: 401, api_error: { type: 'auth.invalid_key', message: 'unknown or revoked credential' }, runner_id: 'runner_1', url: 'https://cp.example' },
    });
    expect(c.message).not.toContain('\n');
    expect(c.message).toContain('refused the credential of runner runner_1 (HTTP 401: unknown or revoked credential) twice in a row: it was revoked or deleted');
    expect(c.message).toContain('agentplane-runner pair --force --code <code> --url https://cp.example --config-dir /srv/runner');
    const forbidden = classify(credentialRefused({ ...refused, http_status: 403, error_type: null, error_message: null }, cred, '/srv/runner'));
    expect(forbidden).toMatchObject({ type: 'credential_refused', code: 5, detail: { http_status: 403, api_error: null } });
    expect(forbidden.message).toContain('(HTTP 403) twice in a row: it is not allowed to connect');
  });
});
