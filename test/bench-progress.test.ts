import { describe, expect, it } from 'vitest';
import { progress } from '../bench/lib/progress.js';

function sink(isTTY: boolean): { out: { isTTY: boolean; write(s: string): void }; text: () => string } {
  let text = '';
  return { out: { isTTY, write: (s: string) => void (text += s) }, text: () => text };
}

describe('bench progress', () => {
  it('off a terminal: one line per phase, no carriage returns', () => {
    const s = sink(false);
    for (const phase of ['cold', 'warm']) {
      const p = progress(phase, 3, s.out);
      for (let i = 1; i <= 3; i++) p.tick(i);
      p.end();
    }
    expect(s.text()).toBe('cold 3/3\nwarm 3/3\n');
  });

  it('on a terminal: redrawn in place, a newline when the phase ends', () => {
    const s = sink(true);
    const p = progress('cold', 2, s.out);
    p.tick(1);
    p.tick(2);
    p.end();
    expect(s.text()).toBe('\rcold 1/2\rcold 2/2\n');
  });
});
