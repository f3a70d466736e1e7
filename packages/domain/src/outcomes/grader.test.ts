import { describe, expect, it } from 'vitest';
import { GRADER_LIMITS, graderSpec, namedPaths, parseVerdict, rubricCriteria } from './grader.js';

describe('rubricCriteria', () => {
  it('takes list items outside code fences, else the whole rubric', () => {
    expect(rubricCriteria('# Rubric\n- Cites sources\n* Under 200 words\n1. Has a title\n```\n- not a criterion\n```\ntext')).toEqual(['Cites sources', 'Under 200 words', 'Has a title']);
    expect(rubricCriteria('Be good.')).toEqual(['The rubric as a whole']);
    expect(rubricCriteria(Array.from({ length: 50 }, (_, i) => `- c${i}`).join('\n'))).toHaveLength(GRADER_LIMITS.maxCriteria);
  });
});

describe('namedPaths', () => {
  it('finds backticked and bare relative paths, ignores URLs, parent escapes and outside absolute paths', () => {
    expect(namedPaths('See `report.md`, notes/plan.txt and https://x.io/a.html; also ../etc/passwd, /etc/hosts and /workspace/out/data.csv.')).toEqual([
      'report.md', 'notes/plan.txt', '/workspace/out/data.csv',
    ]);
    expect(namedPaths('No files here, version 2.')).toEqual([]);
    expect(namedPaths(Array.from({ length: 20 }, (_, i) => `f${i}.md`).join(' '))).toHaveLength(GRADER_LIMITS.maxFiles);
  });
});

describe('parseVerdict', () => {
  const criteria = ['A', 'B'];
  it('reads a bare or fenced JSON verdict and fills criteria the grader left out', () => {
    const v = parseVerdict('{"result":"needs_revision","criteria":[{"criterion":"A","verdict":"fail","explanation":"too short"}]}', criteria);
    expect(v).toEqual({
      result: 'needs_revision',
      criteria: [{ criterion: 'A', verdict: 'fail', explanation: 'too short' }, { criterion: 'B', verdict: 'fail', explanation: null }],
      explanation: '- A: too short\n- B',
    });
    const fenced = parseVerdict('Here:\n```json\n{"result": "satisfied", "explanation": "fine"}\n```', criteria);
    expect(fenced?.result).toBe('satisfied');
    expect(fenced?.criteria.every((c) => c.verdict === 'pass')).toBe(true);
    expect(fenced?.explanation).toBe('fine');
  });
  it('is null for anything that is not a verdict', () => {
    expect(parseVerdict('You said: hello', criteria)).toBeNull();
    expect(parseVerdict('{"result":"great"}', criteria)).toBeNull();
    expect(parseVerdict('{not json}', criteria)).toBeNull();
  });
});

describe('graderSpec', () => {
  it('puts the rubric in the system prompt and only the description and final message in the prompt', () => {
    const s = graderSpec({ description: 'Do X', rubric: '- A', finalMessage: 'Done, see `a.md`', iteration: 2, maxIterations: 3 }, 'grader');
    expect(s.system).toContain('# Rubric\n\n- A');
    expect(s.prompt).toContain('Do X');
    expect(s.prompt).toContain('Evaluation 2 of at most 3.');
    expect(s.paths).toEqual(['a.md']);
    expect(s.routing_key).toBe('grader');
  });
});
