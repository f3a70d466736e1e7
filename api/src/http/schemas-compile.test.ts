import { describe, expect, it } from 'vitest';
import { allOperations } from '../routes.js';
import { compileAll } from './pipeline.js';

describe('operation schemas', () => {
  it('every operation path, query and body schema compiles (the API compiles them on first use)', () => {
    const ops = allOperations();
    expect(ops.length).toBeGreaterThan(100);
    expect(compileAll(ops)).toBe(ops.length);
  });
});
