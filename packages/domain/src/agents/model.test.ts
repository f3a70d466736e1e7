import { describe, expect, it } from 'vitest';
import { ApiError } from '@agentplane/core';
import { normaliseTools } from './model.js';
import type { ToolT } from './tools.js';

const custom = (name: string): ToolT => ({ type: 'custom', name, description: 'd', input_schema: { type: 'object' } });

describe('an Agent\'s tools', () => {
  it('refuses a custom tool named as the built-in skill tool (400 validation.malformed naming it)', () => {
    let refused: unknown;
    try {
      normaliseTools([custom('lookup'), custom('skill')]);
    } catch (err) {
      refused = err;
    }
    expect(refused).toBeInstanceOf(ApiError);
    expect([(refused as ApiError).type, (refused as ApiError).status]).toEqual(['validation.malformed', 400]);
    expect((refused as ApiError).message).toMatch(/^tools\[1\]\.name: 'skill'/);
  });

  it('keeps names that only resemble it, with their default permission', () => {
    expect(normaliseTools([custom('skills'), custom('Skill'), custom('skill_lookup')]).map((t) => [t.name, t.permission]))
      .toEqual([['skills', 'always_allow'], ['Skill', 'always_allow'], ['skill_lookup', 'always_allow']]);
  });

  it('refuses a name twice', () => {
    expect(() => normaliseTools([custom('a'), custom('a')])).toThrow(/each tool name once/);
  });
});
