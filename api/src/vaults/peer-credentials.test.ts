import { describe, expect, it } from 'vitest';
import { ApiError } from '@agentplane/core';
import { parseMtlsCredential, parseOAuth2Credential } from './peer-credentials.js';

/** The error a parse throws: always `validation.malformed`, located by `at`. */
function refusal(fn: () => unknown): ApiError {
  try {
    fn();
  } catch (err) {
    if (err instanceof ApiError) return err;
    throw err;
  }
  throw new Error('expected a refusal');
}

describe('peer credential values', () => {
  it('an OAuth2 value: only the access token is required, absent members are null', () => {
    expect(parseOAuth2Credential('{"access_token":"a"}')).toEqual({
      access_token: 'a', expires_at: null, refresh_token: null, token_url: null, client_id: null, client_secret: null,
    });
    const full = { access_token: 'a', expires_at: '2026-11-24T10:00:00Z', refresh_token: 'r', token_url: 'https://auth.example/token', client_id: 'c', client_secret: 's' };
    expect(parseOAuth2Credential(JSON.stringify(full))).toEqual(full);
  });

  it.each([
    ['not JSON', 'access_token=a', 'secret x: must be one line of JSON'],
    ['an array', '[]', 'secret x'],
    ['no access token', '{"refresh_token":"r"}', "missing required field 'access_token'"],
    // The key is not quoted back (it could be a misplaced secret): the kind's fields are named.
    ['an unknown member', '{"access_token":"a","scope":"x"}', 'secret x: holds a field this kind does not take (its fields: access_token, expires_at,'],
    ['an empty refresh token', '{"access_token":"a","refresh_token":""}', 'secret x.refresh_token'],
    ['expires_at not RFC 3339', '{"access_token":"a","expires_at":"tomorrow"}', 'secret x.expires_at'],
    ['a token URL that is not http(s)', '{"access_token":"a","token_url":"ftp://auth.example/token"}', 'secret x.token_url'],
  ])('an OAuth2 value with %s is validation.malformed', (_what, value, message) => {
    const err = refusal(() => parseOAuth2Credential(value, 'secret x'));
    expect(err.type).toBe('validation.malformed');
    expect(err.message).toContain(message);
    expect(err.message).not.toContain('scope');
  });

  it.each([
    ['no private key', '{"certificate":"-----BEGIN CERTIFICATE-----"}', "missing required field 'private_key'"],
    ['an unknown member', '{"certificate":"c","private_key":"k","chain":"x"}', 'body.value: holds a field this kind does not take (its fields: certificate, private_key)'],
    ['PEM that is not PEM', '{"certificate":"c","private_key":"k"}', 'not valid PEM'],
  ])('an mTLS value with %s is validation.malformed', (_what, value, message) => {
    const err = refusal(() => parseMtlsCredential(value));
    expect(err.type).toBe('validation.malformed');
    expect(err.message).toContain(message);
  });
});
