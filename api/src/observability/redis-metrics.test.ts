import { describe, expect, it } from 'vitest';
import { parseInfo } from './redis-metrics.js';

describe('parseInfo', () => {
  it('reads name:value lines and skips section headers', () => {
    const f = parseInfo('# Memory\r\nused_memory:1048576\r\nmaxmemory:0\r\n\r\n# Persistence\r\naof_enabled:1\r\naof_last_write_status:err\r\n');
    expect(f.get('used_memory')).toBe('1048576');
    expect(f.get('maxmemory')).toBe('0');
    expect(f.get('aof_enabled')).toBe('1');
    expect(f.get('aof_last_write_status')).toBe('err');
    expect(f.has('# Memory')).toBe(false);
  });
});
