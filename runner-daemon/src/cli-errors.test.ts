import { describe, expect, it } from 'vitest';
import { classify, requestFailure } from './cli-errors.js';

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
});
