import { ConfigError } from '@agentplane/core';
import { describe, expect, it } from 'vitest';
import { gatewayLinkUrlFrom, linkUrlFor } from './link.js';

describe('GATEWAY_LINK_URL', () => {
  it('is a ws:// or wss:// origin, off, or unset', () => {
    expect(gatewayLinkUrlFrom({})).toBeUndefined();
    expect(gatewayLinkUrlFrom({ GATEWAY_LINK_URL: 'off' })).toBeNull();
    expect(gatewayLinkUrlFrom({ GATEWAY_LINK_URL: 'ws://10.0.0.7:8080' })).toBe('ws://10.0.0.7:8080');
    expect(gatewayLinkUrlFrom({ GATEWAY_LINK_URL: 'wss://api-1.internal:443/' })).toBe('wss://api-1.internal:443/');
    for (const bad of ['http://10.0.0.7:8080', 'ws://host:1/path', 'ws://', 'true']) {
      expect(() => gatewayLinkUrlFrom({ GATEWAY_LINK_URL: bad }), bad).toThrow(ConfigError);
    }
  });

  it('defaults to the listen address, a loopback one for every interface', () => {
    expect(linkUrlFor('127.0.0.1', 8080)).toBe('ws://127.0.0.1:8080');
    expect(linkUrlFor('0.0.0.0', 8080)).toBe('ws://127.0.0.1:8080');
    expect(linkUrlFor('::', 8080)).toBe('ws://[::1]:8080');
    expect(linkUrlFor('fd00::7', 8080)).toBe('ws://[fd00::7]:8080');
    expect(linkUrlFor('0.0.0.0', 8080, 'wss://api-1.internal:443/')).toBe('wss://api-1.internal:443');
  });
});
