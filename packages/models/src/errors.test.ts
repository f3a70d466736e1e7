import { describe, expect, it } from 'vitest';
import { httpError, parseRetryAfter } from './errors.js';
import { mergePriceTables, parsePriceTable, SHIPPED_PRICES, findPrice } from './prices.js';
import { splitDeltas } from './scripted.js';

describe('provider error classification', () => {
  it('reads retry-after-ms, seconds and HTTP dates', () => {
    expect(parseRetryAfter(new Headers({ 'retry-after-ms': '1500' }))).toBe(1.5);
    expect(parseRetryAfter(new Headers({ 'retry-after': '12' }))).toBe(12);
    const now = Date.parse('2026-01-01T00:00:00Z');
    expect(parseRetryAfter(new Headers({ 'retry-after': 'Thu, 01 Jan 2026 00:00:30 GMT' }), now)).toBe(30);
    expect(parseRetryAfter(new Headers({ 'retry-after': 'soon' }))).toBeNull();
    expect(parseRetryAfter(new Headers())).toBeNull();
  });

  it('maps statuses to retryable classes', () => {
    const h = new Headers();
    expect(httpError('p', 429, h, '').retryable).toBe(true);
    expect(httpError('p', 529, h, '').kind).toBe('server');
    expect(httpError('p', 408, h, '').kind).toBe('timeout');
    expect(httpError('p', 401, h, '').retryable).toBe(false);
    expect(httpError('p', 404, h, '{"error":{"message":"model not found"}}').message).toBe('p returned HTTP 404: model not found');
  });
});

describe('price table', () => {
  it('rejects malformed tables and lays overrides over the shipped one', () => {
    expect(() => parsePriceTable({ openai: { x: { input: -1, output: 1 } } })).toThrow(/openai\/x/);
    const merged = mergePriceTables(SHIPPED_PRICES, parsePriceTable({ openai: { 'gpt-4o': { input: 9, output: 9 } }, ollama: { llama: { input: 0, output: 0 } } }));
    expect(findPrice(merged, 'openai', 'gpt-4o-2024-08-06')).toEqual({ input: 9, output: 9 });
    expect(findPrice(merged, 'openai', 'gpt-4o-mini')).toMatchObject({ input: 0.15 });
    expect(findPrice(merged, 'ollama', 'llama3')).toEqual({ input: 0, output: 0 });
  });
});

describe('scripted deltas', () => {
  it('splits on words and keeps every character', () => {
    expect(splitDeltas('a  b\nc ')).toEqual(['a  ', 'b\n', 'c ']);
    expect(splitDeltas('  lead')).toEqual(['  ', 'lead']);
    expect(splitDeltas('')).toEqual([]);
  });
});
