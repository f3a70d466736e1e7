import { describe, expect, it } from 'vitest';
import { ApiError } from './errors.js';
import { Metadata, Nullable, Obj, Patch, Type, validator } from './schema.js';

const message = (fn: (v: unknown) => unknown, value: unknown): string => {
  try {
    fn(value);
  } catch (err) {
    if (err instanceof ApiError) return err.message;
    throw err;
  }
  return 'accepted';
};

describe('validation messages', () => {
  const Resource = Type.Union([
    Obj({ type: Type.Literal('file'), file_id: Type.String(), mount_path: Type.Optional(Type.String()) }),
    Obj({ type: Type.Literal('repository'), url: Type.String(), ref: Type.Optional(Type.String()) }),
  ]);
  const Agent = Type.Union([
    Type.String(),
    Obj({ name: Type.String(), model: Type.String(), tools: Type.Optional(Type.Array(Type.String())) }),
    Obj({ id: Type.String(), version: Type.Integer({ minimum: 1 }) }),
  ]);
  const Network = Type.Union([
    Obj({ mode: Type.Literal('none') }),
    Obj({ mode: Type.Literal('allowlist'), allowed_hosts: Type.Array(Type.String(), { minItems: 1 }) }),
  ]);
  const Content = Type.Union([Type.String(), Type.Array(Obj({ type: Type.Literal('text'), text: Type.String() }), { minItems: 1 })]);
  const body = validator(Obj({
    agent: Type.Optional(Agent), resource: Type.Optional(Resource), network: Type.Optional(Network), content: Type.Optional(Content),
    order: Type.Optional(Type.Union([Type.Literal('asc'), Type.Literal('desc')])), note: Type.Optional(Nullable(Type.String())),
  }));

  it('names the problem of the alternative a union value was meant for', () => {
    expect(message(body, { agent: { name: 'x', model: 'default', bogus: 1 } })).toBe("body.agent: unknown field 'bogus'");
    expect(message(body, { agent: { id: 'agent_1', version: 0 } })).toBe('body.agent.version: must be >= 1');
    expect(message(body, { agent: { name: 'x' } })).toBe("body.agent: missing required field 'model'");
    expect(message(body, { agent: 5 })).toBe('body.agent: must be string');
    expect(message(body, { resource: { type: 'file', file_id: 'f', extra: 1 } })).toBe("body.resource: unknown field 'extra'");
    expect(message(body, { resource: { type: 'repository' } })).toBe("body.resource: missing required field 'url'");
    expect(message(body, { network: { mode: 'allowlist' } })).toBe("body.network: missing required field 'allowed_hosts'");
    expect(message(body, { content: [] })).toBe('body.content: must NOT have fewer than 1 items');
    expect(message(body, { content: [{ type: 'text', text: 'hi', x: 1 }] })).toBe("body.content.0: unknown field 'x'");
    expect(message(body, { note: 5 })).toBe('body.note: must be string');
    const schedule = validator(Type.Union([
      Obj({ type: Type.Literal('schedule'), cron: Type.String() }),
      Obj({ type: Type.Literal('schedule'), interval_seconds: Type.Integer({ minimum: 1 }) }),
    ]));
    expect(message(schedule, { type: 'schedule', interval_seconds: 0 })).toBe('body.interval_seconds: must be >= 1');
    expect(message(schedule, { type: 'schedule' })).toBe("body: missing required field 'cron'");
    expect(message(body, { agent: 'ok', resource: { type: 'file', file_id: 'f' }, content: 'hi', note: null })).toBe('accepted');
  });

  it('lists the allowed values of a union of constants and of an enum', () => {
    expect(message(body, { order: 'sideways' })).toBe("body.order: must be one of 'asc', 'desc'");
    const query = validator(Obj({ state: Type.Optional(Type.Unsafe<string>({ type: 'string', enum: ['open', 'closed'] })) }), 'query');
    expect(message(query, { state: 'ajar' })).toBe("query.state: must be one of 'open', 'closed'");
  });

  it('names a union\'s discriminator when the value has none of its values, or lacks it', () => {
    expect(message(body, { network: { mode: 'bogus' } })).toBe("body.network.mode: must be one of 'none', 'allowlist'");
    expect(message(body, { resource: { type: 'volume', file_id: 'f' } })).toBe("body.resource.type: must be one of 'file', 'repository'");
    expect(message(body, { resource: { file_id: 'f' } })).toBe("body.resource: missing required field 'type'");
    // A known discriminator value still reports that alternative's own problem.
    expect(message(body, { network: { mode: 'none', extra: 1 } })).toBe("body.network: unknown field 'extra'");
  });

  it('says what a body setting too few fields lacks: a required field, else one of the fields to change', () => {
    const patch = validator(Obj(
      { expected_version: Type.Integer({ minimum: 1 }), name: Type.Optional(Type.String()), status: Type.Optional(Type.String()) },
      { minProperties: 2 },
    ));
    expect(message(patch, {})).toBe("body: missing required field 'expected_version'");
    expect(message(patch, { expected_version: 1 })).toBe("body: nothing to change: set at least one of 'name', 'status'");
    expect(message(patch, { expected_version: 1, name: 'x' })).toBe('accepted');
    const optional = validator(Obj({ name: Type.Optional(Type.String()) }, { minProperties: 1 }));
    expect(message(optional, {})).toBe("body: nothing to change: set at least one of 'name'");
  });

  it('a Patch setting only its compare-and-swap field, or nothing, changes nothing and says what it may set', () => {
    const patch = validator(Patch({ expected_version: Type.Optional(Type.Integer({ minimum: 1 })), name: Type.Optional(Type.String()), status: Type.Optional(Type.String()) }));
    expect(message(patch, {})).toBe("body: nothing to change: set at least one of 'name', 'status'");
    expect(message(patch, { expected_version: 1 })).toBe("body: nothing to change: set at least one of 'name', 'status'");
    expect(message(patch, { name: 'x' })).toBe('accepted');
    expect(message(patch, { expected_version: 1, status: 'y' })).toBe('accepted');
    expect(message(patch, { expected_version: 1, other: 'y' })).toBe("body: unknown field 'other'");
  });

  it('takes only safe integers, even where the schema sets no bound', () => {
    const query = validator(Obj({ after: Type.Optional(Type.Integer({ minimum: 0 })), n: Type.Optional(Type.Integer({ maximum: 10 })) }), 'query');
    expect(message(query, { after: '9007199254740991' })).toBe('accepted');
    expect(message(query, { after: '1e21' })).toBe('query.after: must be an integer in decimal digits');
    expect(message(query, { after: '18446744073709551615' })).toBe('query.after: must be <= 9007199254740991');
    expect(message(query, { n: '11' })).toBe('query.n: must be <= 10');
    expect(message(query, { n: '-9007199254740993' })).toBe('query.n: must be >= -9007199254740991');
  });

  it('bounds the keys of metadata, which a record schema alone would not', () => {
    const body = validator(Obj({ metadata: Type.Optional(Metadata()) }));
    expect(message(body, { metadata: { team: 'core' } })).toBe('accepted');
    expect(message(body, { metadata: { ['k'.repeat(200_000)]: 'v' } })).toBe(`body.metadata: the key '${'k'.repeat(40)}…' must NOT have more than 64 characters`);
    expect(message(body, { metadata: { '': 'v' } })).toBe("body.metadata: the key '' must NOT have fewer than 1 characters");
    expect(message(body, { metadata: { team: 'x'.repeat(513) } })).toBe('body.metadata.team: must NOT have more than 512 characters');
  });

  it('reads a number in a parameter only as decimal digits, which is how ajv alone would not', () => {
    const query = validator(Obj({
      limit: Type.Optional(Type.Integer({ minimum: 1, maximum: 100 })),
      ratio: Type.Optional(Type.Number()),
      ids: Type.Optional(Type.Array(Type.Integer())),
      name: Type.Optional(Type.String()),
    }), 'query');
    for (const text of ['Infinity', '-Infinity', '1e400', '1e2', '0x10', '0b1', ' 5', '5 ', '+5', '05', '1.0', '', 'NaN']) {
      expect(message(query, { limit: text }), text).toBe('query.limit: must be an integer in decimal digits');
    }
    expect(message(query, { limit: '5' })).toBe('accepted');
    expect(message(query, { limit: '0' })).toBe('query.limit: must be >= 1');
    expect(message(query, { limit: '-0' })).toBe('query.limit: must be >= 1');
    expect(message(query, { ratio: '0.5' })).toBe('accepted');
    expect(message(query, { ratio: '-Infinity' })).toBe('query.ratio: must be a number in decimal digits');
    expect(message(query, { ratio: '.5' })).toBe('query.ratio: must be a number in decimal digits');
    expect(message(query, { ids: ['1', '2'] })).toBe('accepted');
    expect(message(query, { ids: '3' })).toBe('accepted');
    expect(message(query, { ids: ['1', 'Infinity'] })).toBe('query.ids.1: must be an integer in decimal digits');
    expect(message(query, { name: 'Infinity' })).toBe('accepted');
    const path = validator(Obj({ version: Type.Integer({ minimum: 1 }) }), 'path');
    expect(message(path, { version: '0x1' })).toBe('path.version: must be an integer in decimal digits');
    // A body is JSON: its numbers are numbers, never text to read.
    expect(message(validator(Obj({ n: Type.Integer() })), { n: 'Infinity' })).toBe('body.n: must be integer');
  });
});
