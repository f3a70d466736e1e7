import { describe, expect, it } from 'vitest';
import { ConfigError } from '@agentplane/core';
import { loadSchedulerConfig } from './config.js';

describe('scheduler settings', () => {
  it('an unreadable MASTER_KEY_FILE is a ConfigError naming the setting', () => {
    const load = () => loadSchedulerConfig({ REDIS_URL: 'redis://127.0.0.1:6379', MASTER_KEY_FILE: '/nonexistent/agentplane/master.key' });
    expect(load).toThrow(ConfigError);
    expect(load).toThrow(/^MASTER_KEY_FILE cannot be read: ENOENT/);
  });

  it('a master key of the wrong length is a ConfigError; none at all is allowed', () => {
    expect(() => loadSchedulerConfig({ REDIS_URL: 'redis://127.0.0.1:6379', MASTER_KEY: 'abcd' })).toThrow(ConfigError);
    expect(loadSchedulerConfig({ REDIS_URL: 'redis://127.0.0.1:6379' }).masterKey).toBeUndefined();
  });
});
