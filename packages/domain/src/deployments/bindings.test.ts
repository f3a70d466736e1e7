import { describe, expect, it } from 'vitest';
import { argumentsOutsideSchema, exposedName, exposedNameClash, upstreamName, type ToolShaping } from './bindings.js';

const shaping: ToolShaping = {
  agent_deployment_connection_binding_id: 'adcb_1', binding_revision_number: 1,
  tool_selection: ['echo', 'ping'], tool_aliases: { echo: 'say' }, argument_policy: 'strict',
};

describe('tool shaping by a binding revision', () => {
  it('offers selected tools only, under their alias', () => {
    expect(exposedName(shaping, 'echo')).toBe('say');
    expect(exposedName(shaping, 'ping')).toBe('ping');
    expect(exposedName(shaping, 'secret')).toBeNull();
  });

  it('maps an exposed name back to the upstream tool; an aliased tool is not reachable under its own name', () => {
    expect(upstreamName(shaping, 'say')).toBe('echo');
    expect(upstreamName(shaping, 'ping')).toBe('ping');
    expect(upstreamName(shaping, 'echo')).toBeNull();
    expect(upstreamName(shaping, 'secret')).toBeNull();
  });

  it('a tool named like an Object.prototype member has no alias unless given one', () => {
    const odd: ToolShaping = { ...shaping, tool_selection: ['toString', 'constructor'], tool_aliases: { constructor: 'make' } };
    expect(exposedName(odd, 'toString')).toBe('toString');
    expect(upstreamName(odd, 'toString')).toBe('toString');
    expect(upstreamName(odd, 'make')).toBe('constructor');
    expect(upstreamName(odd, 'constructor')).toBeNull();
  });

  it('strict: only top-level names of the input schema properties are admitted', () => {
    const schema = { type: 'object', properties: { text: { type: 'string' } } };
    expect(argumentsOutsideSchema(schema, { text: 'x' })).toEqual([]);
    expect(argumentsOutsideSchema(schema, {})).toEqual([]);
    expect(argumentsOutsideSchema(schema, { text: 'x', loud: true, a: 1 })).toEqual(['a', 'loud']);
    expect(argumentsOutsideSchema({ type: 'object' }, { any: 1 })).toEqual(['any']);
    expect(argumentsOutsideSchema(undefined, {})).toEqual([]);
  });

  it('refuses two selected tools under one name', () => {
    expect(exposedNameClash(['echo', 'ping'], { echo: 'say' })).toBeNull();
    expect(exposedNameClash(['echo', 'ping'], { echo: 'ping' })).toBe('ping');
    expect(exposedNameClash(['echo', 'ping'], { echo: 'x', ping: 'x' })).toBe('x');
  });
});
