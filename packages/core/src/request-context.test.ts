import { describe, expect, it } from 'vitest';
import { incident, requestIdFrom, traceIdOf } from './request-context.js';
import { closedLabel, statusLabel } from './metrics.js';

const TP = '00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01';

describe('request ids', () => {
  it('takes a well-formed X-Request-Id first, then the traceparent trace id, else a new id', () => {
    expect(requestIdFrom({ 'x-request-id': 'abc-123', traceparent: TP })).toBe('abc-123');
    expect(requestIdFrom({ traceparent: TP })).toBe('4bf92f3577b34da6a3ce929d0e0e4736');
    expect(requestIdFrom({ 'x-request-id': 'bad id', traceparent: TP })).toBe('4bf92f3577b34da6a3ce929d0e0e4736');
    expect(requestIdFrom({})).toMatch(/^req_[0-9a-f]{24}$/);
    expect(requestIdFrom({ 'x-request-id': 'a'.repeat(129) })).toMatch(/^req_/);
    expect(requestIdFrom({ 'x-request-id': 'a'.repeat(128) })).toBe('a'.repeat(128));
    expect(requestIdFrom({ 'x-request-id': 'x\r\nSet-Cookie: y' })).toMatch(/^req_/);
    // With tracing on, the request span's trace id stands in for a new id (a caller's id still wins).
    const own = 'aaaabbbbccccddddeeeeffff00001111';
    expect(requestIdFrom({}, own)).toBe(own);
    expect(requestIdFrom({ 'x-request-id': 'mine' }, own)).toBe('mine');
  });

  it('accepts only valid traceparents', () => {
    expect(traceIdOf(TP)).toBe('4bf92f3577b34da6a3ce929d0e0e4736');
    expect(traceIdOf('00-00000000000000000000000000000000-00f067aa0ba902b7-01')).toBeUndefined();
    expect(traceIdOf('00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01')).toBeUndefined();
    expect(traceIdOf('ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01')).toBeUndefined();
    expect(traceIdOf('00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01')).toBeUndefined();
    expect(traceIdOf(undefined)).toBeUndefined();
    // Uppercase hex is not a valid traceparent (W3C Trace Context): ignored, not lowered.
    expect(traceIdOf('00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01')).toBeUndefined();
  });

  it('names the request in an incident message when given its id', () => {
    expect(incident('internal error', 'req_given').message).toMatch(/^internal error; incident reference inc_[0-9a-f]{16}, request id req_given$/);
    expect(incident('internal error').message).toMatch(/^internal error; incident reference inc_[0-9a-f]{16}$/);
  });
});

describe('closed labels', () => {
  it('passes known values and folds everything else into other', () => {
    const set = new Set(['tools/call', 'ping']);
    expect(closedLabel('ping', set)).toBe('ping');
    expect(closedLabel('made/up', set)).toBe('other');
    expect(closedLabel(undefined, ['a'])).toBe('other');
    expect(statusLabel(404)).toBe('404');
    expect(statusLabel(7000)).toBe('other');
  });
});
