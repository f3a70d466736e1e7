import { describe, expect, it } from 'vitest';
import { repeatedKeys } from './harness/log-lines.js';

// The check every platform a test starts gets at its stop (test/harness/platform.ts).
describe('log lines that repeat a key', () => {
  it('finds a repeated key at the top level and inside nested objects', () => {
    expect(repeatedKeys('{"level":30,"runner":"a","runner":"b","msg":"x"}')).toEqual(['runner']);
    expect(repeatedKeys('{"a":{"b":1,"b":[{"c":1,"c":2}]},"d":"}{\\"d\\":"}')).toEqual(['b', 'c']);
  });

  it('passes lines whose keys are all different, whatever their values hold', () => {
    expect(repeatedKeys('{"name":"runner","runner":"r","resource":"x","gone_runner":"y","msg":"a \\"runner\\": b"}')).toEqual([]);
    expect(repeatedKeys('{"a":[1,2,{"a":3}],"b":{"a":null},"c":true,"e":-1.5e3}')).toEqual([]);
    expect(repeatedKeys('{}')).toEqual([]);
  });
});
