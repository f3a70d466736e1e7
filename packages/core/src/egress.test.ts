import { describe, expect, it } from 'vitest';
import { addressAllowed, checkEndpointUrl, classify, resolveAllowed } from './egress.js';

const prod = { development: false, allowPrivate: false };
const dev = { development: true, allowPrivate: false };

describe('egress guard', () => {
  it('classifies addresses, including IPv4-mapped IPv6', () => {
    expect(['127.0.0.1', '::1', '::ffff:127.0.0.1'].map(classify)).toEqual(['loopback', 'loopback', 'loopback']);
    expect(['10.1.2.3', '172.20.0.1', '192.168.1.1', '169.254.169.254', '100.64.0.1', 'fd00::1', 'fe80::1', '::ffff:10.0.0.1', '0.0.0.0'].map(classify))
      .toEqual(new Array(9).fill('private'));
    expect(['8.8.8.8', '2606:4700::1111'].map(classify)).toEqual(['public', 'public']);
    expect(addressAllowed('127.0.0.1', dev)).toBe(true);
    expect(addressAllowed('127.0.0.1', prod)).toBe(false);
    expect(addressAllowed('10.0.0.1', dev)).toBe(false);
    expect(addressAllowed('10.0.0.1', { development: false, allowPrivate: true })).toBe(true);
  });
  it('checks URLs as written', () => {
    expect(checkEndpointUrl('https://hooks.example.com/x', prod).hostname).toBe('hooks.example.com');
    expect(() => checkEndpointUrl('http://hooks.example.com/x', prod)).toThrow(/https is required/);
    expect(() => checkEndpointUrl('https://user:pw@hooks.example.com/', prod)).toThrow(/credentials/);
    expect(() => checkEndpointUrl('https://127.0.0.1/', prod)).toThrow(/loopback/);
    expect(() => checkEndpointUrl('https://localhost/', prod)).toThrow(/loopback/);
    // The message names the field the URL came in.
    expect(() => checkEndpointUrl('https://[::1', prod, 'body.card_url')).toThrow(/^body\.card_url: not a URL$/);
    expect(() => checkEndpointUrl('https://localhost/', prod, 'body.rpc_url')).toThrow(/^body\.rpc_url: /);
    // The root dot names the same host.
    expect(() => checkEndpointUrl('https://localhost./x', prod)).toThrow(/loopback/);
    expect(() => checkEndpointUrl('https://foo.localhost./x', prod)).toThrow(/loopback/);
    expect(() => checkEndpointUrl('https://169.254.169.254/latest', prod)).toThrow(/private/);
    expect(() => checkEndpointUrl('https://[::ffff:10.0.0.1]/', dev)).toThrow(/private/);
    expect(checkEndpointUrl('http://127.0.0.1:9999/hook', dev).port).toBe('9999');
    expect(() => checkEndpointUrl('http://10.0.0.1/hook', dev)).toThrow();
  });
  it('refuses a host that resolves to a private address at delivery time', async () => {
    await expect(resolveAllowed('localhost', prod)).rejects.toThrow(/refused/);
    await expect(resolveAllowed('127.0.0.1', dev)).resolves.toEqual({ address: '127.0.0.1', family: 4 });
  });
});
