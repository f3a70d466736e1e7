import { describe, expect, it } from 'vitest';
import type { ModelMessage } from '@agentplane/protocol';
import { policyRefusal } from '../loop.js';
import { RunAudit } from './audit.js';
import { encodeLine, LineSplitter, RelayError, STOPPED_DECISION, type RelayTool } from './protocol.js';
import { parseHarnessLine, RELAY_MAX_EVENT_BYTES, validateEvent } from './validate.js';

const rejects = (line: string, reason: RelayError['reason']): void => {
  let caught: unknown;
  try {
    parseHarnessLine(line);
  } catch (err) {
    caught = err;
  }
  expect(caught).toBeInstanceOf(RelayError);
  expect((caught as RelayError).reason).toBe(reason);
};

const event = (type: string, payload: unknown): string => JSON.stringify({ type: 'event', event: { type, payload } });

describe('relay lines from a colocated harness', () => {
  it('accepts the messages of the protocol', () => {
    expect(parseHarnessLine(event('agent.message', { content: [{ type: 'text', text: 'hi' }] }))).toMatchObject({ type: 'event', event: { type: 'agent.message' } });
    expect(parseHarnessLine(event('agent.tool_use', { id: 'toolu_1', name: 'bash', input: { command: 'ls' }, blocking: false }))).toMatchObject({ type: 'event' });
    expect(parseHarnessLine(event('agent.tool_result', { tool_use_id: 'toolu_1', content: 'ok', is_error: false, exit_code: 0, duration_ms: 12 }))).toMatchObject({ type: 'event' });
    const request = { routing_key: 'default', messages: [{ role: 'user', content: [{ type: 'text', text: 'hi' }] }], tools: [] };
    expect(parseHarnessLine(encodeLine({ type: 'model.request', id: 'm1', request: request as never }))).toMatchObject({ type: 'model.request', id: 'm1' });
    expect(parseHarnessLine('{"type":"done","outcome":{"stop_reason":{"type":"end_turn"}}}')).toEqual({ type: 'done', outcome: { stop_reason: { type: 'end_turn' } } });
    expect(parseHarnessLine('{"type":"done","outcome":{"stop_reason":{"type":"requires_action","tool_use_ids":["toolu_1"]}}}')).toMatchObject({ type: 'done' });
    expect(parseHarnessLine('{"type":"log","level":"info","msg":"x"}')).toEqual({ type: 'log', level: 'info', msg: 'x' });
  });

  it('rejects garbage: not JSON, not an object, unknown message types and fields', () => {
    rejects('hello from a tool that wrote to the harness stdout', 'not_json');
    rejects('{"type":"event"', 'not_json');
    rejects('[1,2,3]', 'invalid_message');
    rejects('"done"', 'invalid_message');
    rejects('{"type":"shell","command":"rm -rf /"}', 'invalid_message');
    rejects('{"type":"done","outcome":{"stop_reason":{"type":"end_turn"}},"usage":{"input_tokens":1}}', 'invalid_message');
    rejects('{"type":"done","outcome":{"stop_reason":{"type":"budget_exceeded"}}}', 'invalid_message');
    rejects('{"type":"done","outcome":{"stop_reason":{"type":"requires_action","tool_use_ids":[]}}}', 'invalid_message');
    rejects('{"type":"model.request","id":"m 1","request":{}}', 'invalid_message');
    rejects('{"type":"model.request","id":"m1","request":{"routing_key":"default","messages":[],"tools":[]}}', 'invalid_message');
  });

  it('rejects events the split harness never emits, and malformed payloads', () => {
    rejects(event('session.status_idle', { stop_reason: { type: 'end_turn' }, usage: {} }), 'invalid_event');
    rejects(event('session.status_terminated', {}), 'invalid_event');
    rejects(event('user.message', { content: 'forged' }), 'invalid_event');
    rejects(event('agent.custom', {}), 'invalid_event');
    rejects(event('agent.message', { content: [] }), 'invalid_event');
    rejects(event('agent.message', { content: [{ type: 'thinking', text: 'x' }] }), 'invalid_event');
    rejects(event('agent.message', { content: [{ type: 'text', text: 'x' }], usage: { input_tokens: 0 } }), 'invalid_event');
    rejects(event('agent.tool_use', { id: 'toolu_1', name: 'bash', input: {}, blocking: true }), 'invalid_event');
    rejects(event('agent.tool_use', { id: 'toolu_1', name: 'bash', input: {}, blocking: 'no' }), 'invalid_event');
    rejects(event('agent.tool_result', { tool_use_id: 'toolu_1', content: 7, is_error: false }), 'invalid_event');
    rejects(event('agent.tool_result', { tool_use_id: 'toolu_1', content: '', is_error: false, exit_code: 1e6 }), 'invalid_event');
  });

  it('caps the size of one event', () => {
    const big = 'x'.repeat(RELAY_MAX_EVENT_BYTES + 1);
    expect(() => validateEvent({ type: 'agent.message', payload: { content: [{ type: 'text', text: big }] } })).toThrow(/larger than/);
  });
});

describe('line framing', () => {
  it('splits chunks into lines and rejects a line past the cap once', () => {
    const lines: string[] = [];
    const errors: RelayError[] = [];
    const s = new LineSplitter((l) => lines.push(l), (e) => errors.push(e), 16);
    s.push(Buffer.from('{"a":1}\n{"b"'));
    s.push(Buffer.from(':2}\n\n'));
    expect(lines).toEqual(['{"a":1}', '{"b":2}']);
    s.push(Buffer.from('0123456789'));
    s.push(Buffer.from('0123456789\n{"c":3}\n'));
    expect(errors).toHaveLength(1);
    expect(errors[0]?.reason).toBe('line_too_long');
    expect(lines).toHaveLength(2);
  });

  it('keeps multi-byte characters split across chunks intact', () => {
    const lines: string[] = [];
    const s = new LineSplitter((l) => lines.push(l), () => undefined);
    const bytes = Buffer.from('{"t":"héllo ✓"}\n');
    s.push(bytes.subarray(0, 8));
    s.push(bytes.subarray(8));
    expect(JSON.parse(lines[0] ?? '')).toEqual({ t: 'héllo ✓' });
  });
});

describe('what the runner holds a harness to', () => {
  const tools: RelayTool[] = [
    { type: 'builtin', name: 'bash' },
    { type: 'builtin', name: 'write', permission: 'always_ask' },
    { type: 'custom', spec: { name: 'get_weather', description: 'w', input_schema: {} } },
    { type: 'external', spec: { name: 'ext__echo', description: 'e', input_schema: {} }, permission: 'always_ask' },
  ];
  const earlier: ModelMessage[] = [
    { role: 'user', content: [{ type: 'text', text: 'go' }] },
    { role: 'assistant', content: [{ type: 'tool_use', id: 'toolu_old', name: 'ext__echo', input: {} }] },
  ];

  it('only reports tool uses the model made, classified as the policy says, answered once', () => {
    const audit = new RunAudit(tools, earlier);
    const use = (id: string, name: string, awaiting?: 'custom_tool_result' | 'tool_confirmation') =>
      audit.event({ type: 'agent.tool_use', payload: { id, name, input: {}, blocking: awaiting !== undefined, ...(awaiting ? { awaiting } : {}) } });
    expect(() => use('toolu_forged', 'bash')).toThrow(/not a tool use the model made/);
    audit.modelEvent({ type: 'tool_use', id: 'toolu_1', name: 'bash', input: {} });
    audit.modelEvent({ type: 'tool_use', id: 'toolu_2', name: 'get_weather', input: {} });
    audit.modelEvent({ type: 'tool_use', id: 'toolu_3', name: 'write', input: {} });
    expect(() => use('toolu_1', 'write')).toThrow(/not a tool use the model made/);
    expect(() => use('toolu_2', 'get_weather')).toThrow(/policy/);
    expect(() => use('toolu_3', 'write')).toThrow(/policy/);
    use('toolu_1', 'bash');
    expect(() => use('toolu_1', 'bash')).toThrow(/twice/);
    use('toolu_2', 'get_weather', 'custom_tool_result');
    const result = (id: string) => audit.event({ type: 'agent.tool_result', payload: { tool_use_id: id, content: '', is_error: false } });
    result('toolu_1');
    expect(() => result('toolu_1')).toThrow(/twice/);
    expect(() => result('toolu_nowhere')).toThrow(/not a tool use/);
    result('toolu_old');
  });

  it('reports only what a finished model step said, as the step said it, once', () => {
    const audit = new RunAudit(tools, earlier);
    const usage = { input_tokens: 1, cached_input_tokens: 0, cache_write_input_tokens: 0, output_tokens: 1, reasoning_output_tokens: 0, total_tokens: 2 };
    const end = { type: 'end' as const, stop_reason: 'tool_use' as const, usage, provider: 'p', model: 'm' };
    const message = (...texts: string[]) => audit.event({ type: 'agent.message', payload: { content: texts.map((text) => ({ type: 'text' as const, text })) } });
    const thinking = (text: string) => audit.event({ type: 'agent.thinking', payload: { content: [{ type: 'thinking', text }] } });
    // A process in the sandbox writing an agent.message to the harness's output: nothing was said.
    expect(() => message('FORGED BY SANDBOX')).toThrow(/does not say what a model step of this Run said/);
    // Two streams at once; deltas run on into one block until another kind of block comes.
    audit.modelEvent({ type: 'thinking_delta', text: 'hm' }, 's1');
    audit.modelEvent({ type: 'text_delta', text: 'Hel' }, 's1');
    audit.modelEvent({ type: 'text_delta', text: 'lo' }, 's2');
    audit.modelEvent({ type: 'text_delta', text: 'lo' }, 's1');
    audit.modelEvent({ type: 'tool_use', id: 'toolu_9', name: 'bash', input: {} }, 's1');
    audit.modelEvent({ type: 'text_delta', text: 'after' }, 's1');
    // Not ended yet: not said yet.
    expect(() => message('Hello', 'after')).toThrow(/does not say/);
    audit.modelEvent(end, 's1');
    expect(() => message('Hello after')).toThrow(/does not say/);
    message('Hello', 'after');
    expect(() => message('Hello', 'after')).toThrow(/says it again/);
    thinking('hm');
    // A stream that broke off before its end was never a step.
    audit.modelEvent({ type: 'error', error: { type: 'runtime.internal', message: 'x', retryable: true } }, 's2');
    expect(() => message('lo')).toThrow(/does not say/);
  });

  it('stops with requires_action only on blocking uses', () => {
    const audit = new RunAudit(tools, earlier);
    audit.modelEvent({ type: 'tool_use', id: 'toolu_1', name: 'bash', input: {} });
    audit.modelEvent({ type: 'tool_use', id: 'toolu_2', name: 'get_weather', input: {} });
    expect(() => audit.done({ type: 'requires_action', tool_use_ids: ['toolu_1'] })).toThrow(/not a blocking tool use/);
    expect(audit.done({ type: 'requires_action', tool_use_ids: ['toolu_2', 'toolu_old'] })).toMatchObject({ type: 'requires_action' });
    expect(audit.awaitingOfUse('toolu_old')).toBe('tool_confirmation');
  });

  it('calls an always_ask MCP tool only once the user allowed that use', () => {
    const denied = new RunAudit(tools, earlier, { confirmations: { toolu_old: 'deny' } });
    expect(() => denied.toolCall('toolu_old', 'ext__echo')).toThrow(/confirmation/);
    const fresh = new RunAudit(tools, earlier);
    fresh.modelEvent({ type: 'tool_use', id: 'toolu_new', name: 'ext__echo', input: {} });
    expect(() => fresh.toolCall('toolu_new', 'ext__echo')).toThrow(/confirmation/);
    const allowed = new RunAudit(tools, earlier, { confirmations: { toolu_old: 'allow' } });
    expect(() => allowed.toolCall('toolu_old', 'bash')).toThrow(/not an MCP tool/);
    expect(allowed.toolCall('toolu_old', 'ext__echo').spec.name).toBe('ext__echo');
    expect(() => allowed.toolCall('toolu_old', 'ext__echo')).toThrow(/twice/);
  });

  it('bounds the model steps of one Run', () => {
    const audit = new RunAudit(tools, earlier, {}, 2);
    audit.modelRequest();
    audit.modelRequest();
    expect(() => audit.modelRequest()).toThrow(/more than 2 model steps/);
  });

  it('under governance: every use is checked first, a denied one is only reported as refused and never called', () => {
    expect(parseHarnessLine(encodeLine({ type: 'tool.check', id: 'c1', tool_use_id: 'toolu_1' }))).toEqual({ type: 'tool.check', id: 'c1', tool_use_id: 'toolu_1' });
    expect(() => parseHarnessLine(JSON.stringify({ type: 'tool.check', id: 'c1', tool_use_id: 'toolu_1', name: 'bash' }))).toThrow(/unknown field/);
    const audit = new RunAudit(tools, earlier, { confirmations: { toolu_old: 'allow' } }, 100, true);
    audit.modelEvent({ type: 'tool_use', id: 'toolu_1', name: 'bash', input: { command: 'touch x' } });
    audit.modelEvent({ type: 'tool_use', id: 'toolu_2', name: 'bash', input: { command: 'ls' } });
    const use = (id: string, awaiting?: 'tool_confirmation') =>
      audit.event({ type: 'agent.tool_use', payload: { id, name: 'bash', input: {}, blocking: awaiting !== undefined, ...(awaiting ? { awaiting } : {}) } });
    expect(() => use('toolu_1')).toThrow(/before its policy check/);
    expect(() => audit.checkQuery('toolu_forged')).toThrow(/not a tool use/);
    // The query is the runner's record of the use, whatever the harness might claim.
    expect(audit.checkQuery('toolu_1')).toEqual({ tool_use_id: 'toolu_1', tool: { kind: 'builtin', name: 'bash' }, input: { command: 'touch x' } });
    expect(() => audit.checkQuery('toolu_1')).toThrow(/twice/);
    const deny = { decision: 'deny' as const, rule_id: 'apol_1', message: 'no touching' };
    audit.decided('toolu_1', deny);
    use('toolu_1');
    const ran = { tool_use_id: 'toolu_1', content: 'done', is_error: false, exit_code: 0 };
    expect(() => audit.event({ type: 'agent.tool_result', payload: ran })).toThrow(/not reported as that refusal/);
    expect(() => audit.modelMessages([{ role: 'user', content: [{ type: 'tool_result', tool_use_id: 'toolu_1', content: 'done' }] }])).toThrow(/refused by policy/);
    audit.modelMessages([{ role: 'user', content: [{ type: 'tool_result', tool_use_id: 'toolu_1', content: policyRefusal(deny), is_error: true }] }]);
    audit.event({ type: 'agent.tool_result', payload: { tool_use_id: 'toolu_1', content: policyRefusal(deny), is_error: true, denied: true, policy_rule_id: 'apol_1' } });

    audit.checkQuery('toolu_2');
    audit.decided('toolu_2', { decision: 'require_approval', rule_id: 'apol_2', message: 'ask' });
    expect(() => use('toolu_2')).toThrow(/policy/);
    use('toolu_2', 'tool_confirmation');
    expect(audit.done({ type: 'requires_action', tool_use_ids: ['toolu_2'] })).toMatchObject({ type: 'requires_action' });

    // An MCP call the policy denied is never made, even for a use the user confirmed.
    audit.checkQuery('toolu_old');
    audit.decided('toolu_old', deny);
    expect(() => audit.toolCall('toolu_old', 'ext__echo')).toThrow(/ActionPolicy/);
  });

  it('under governance, once the Run is stopped a use not decided yet is refused on both ends', () => {
    const audit = new RunAudit(tools, earlier, {}, 100, true);
    audit.modelEvent({ type: 'tool_use', id: 'toolu_1', name: 'bash', input: {} });
    audit.checkQuery('toolu_1');
    audit.stop();
    audit.event({ type: 'agent.tool_use', payload: { id: 'toolu_1', name: 'bash', input: {}, blocking: false } });
    expect(() => audit.event({ type: 'agent.tool_result', payload: { tool_use_id: 'toolu_1', content: 'ran', is_error: false } })).toThrow(/refusal/);
    // A late allow from the control plane does not undo the refusal.
    audit.decided('toolu_1', { decision: 'allow', rule_id: null, message: 'ok' });
    audit.event({ type: 'agent.tool_result', payload: { tool_use_id: 'toolu_1', content: policyRefusal(STOPPED_DECISION), is_error: true, denied: true } });
  });
});
