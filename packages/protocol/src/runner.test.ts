import { describe, expect, it } from 'vitest';
import { FrameError, frame, negotiateVersion, parseFrame, runnerConnectUrl } from './runner.js';

const caps = { protocol_versions: [1], available_slots: 1, drivers: ['process'], plane_protocols: ['model-gateway-v1'], providers: [] };

describe('runner frames', () => {
  it('round-trips a valid hello', () => {
    const text = frame('hello', 'a', { protocol_versions: [1], daemon_version: 't', status: 'ready', capabilities: caps, held_leases: [] });
    expect(parseFrame(text, 'runner').type).toBe('hello');
  });
  it('rejects non-JSON, unknown fields, wrong direction and bad payloads with FrameError', () => {
    expect(() => parseFrame('{', 'runner')).toThrow(FrameError);
    // A payload nested past the platform's limit never reaches the parser or the log.
    const deep = '['.repeat(300) + ']'.repeat(300);
    expect(() => parseFrame(`{"v":1,"type":"events.batch","id":"x","payload":{"lease_id":"l","attempt":1,"session_id":"s","events":[{"producer_key":"k","type":"agent.message","payload":${deep}}]}}`, 'runner')).toThrow(/nests deeper than 256/);
    expect(() => parseFrame(JSON.stringify({ v: 1, type: 'ack', id: 'x', payload: {}, extra: 1 }), 'runner')).toThrow(/unknown field 'extra'/);
    expect(() => parseFrame(JSON.stringify({ v: 1, type: 'welcome', id: 'x', payload: {} }), 'runner')).toThrow(/unknown message type 'welcome' from the runner/);
    expect(() => parseFrame(JSON.stringify({ v: 2, type: 'ack', id: 'x', payload: {} }), 'runner')).toThrow(/unsupported envelope version/);
    expect(() => parseFrame(JSON.stringify({ v: 1, type: 'lease.fail', id: 'x', payload: { lease_id: 'l', attempt: 0, failure_class: 'work', reason: 'r' } }), 'runner')).toThrow(FrameError);
  });
  it("admits only the agent's own event types in a runner's events.batch", () => {
    const batch = (type: string) => JSON.stringify({
      v: 1, type: 'events.batch', id: 'x',
      payload: { lease_id: 'l', attempt: 1, session_id: 's', events: [{ producer_key: 'l:0', type, payload: {} }] },
    });
    expect(parseFrame(batch('agent.tool_use'), 'runner').type).toBe('events.batch');
    // A turn's status, a user's message and a name that smuggles a counter are the control plane's or nobody's.
    for (const type of ['session.status_idle', 'user.message', 'exec.tool_invocation', 'x;last_event_at', 'agent.message=1']) {
      expect(() => parseFrame(batch(type), 'runner'), type).toThrow(FrameError);
    }
  });
  it('refuses to build an invalid frame', () => {
    expect(() => frame('heartbeat', 'x', { status: 'ready', available_slots: -1, held_leases: [] })).toThrow(FrameError);
  });
  it('negotiates the highest common version', () => {
    expect(negotiateVersion([1, 2, 3], [1, 2])).toBe(2);
    expect(negotiateVersion([3], [1])).toBeNull();
  });

  it('the gateway URL keeps the path', () => {
    expect(runnerConnectUrl('https://host/agentplane').toString()).toBe('wss://host/agentplane/v1/runners/connect');
    expect(runnerConnectUrl('http://127.0.0.1:8080/').toString()).toBe('ws://127.0.0.1:8080/v1/runners/connect');
  });
});
