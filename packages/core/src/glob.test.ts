import { describe, expect, it } from 'vitest';
import { compileGlob, GLOB_LIMITS, GlobError, matchGlob } from './glob.js';

const yes = (pattern: string, ...subjects: string[]): void => {
  for (const s of subjects) expect(matchGlob(pattern, s), `${pattern} should match ${s}`).toBe(true);
};
const no = (pattern: string, ...subjects: string[]): void => {
  for (const s of subjects) expect(matchGlob(pattern, s), `${pattern} should not match ${s}`).toBe(false);
};
const refused = (pattern: string, reason: 'syntax' | 'too_complex'): GlobError => {
  try {
    compileGlob(pattern);
  } catch (err) {
    expect(err).toBeInstanceOf(GlobError);
    expect((err as GlobError).reason).toBe(reason);
    return err as GlobError;
  }
  throw new Error(`${pattern} was accepted`);
};

describe('glob syntax', () => {
  it('matches literals exactly, whole subject only', () => {
    yes('a.txt', 'a.txt');
    no('a.txt', 'a_txt', 'xa.txt', 'a.txtx', 'dir/a.txt');
    yes('', '');
    no('', 'a');
  });

  it('* matches within one segment, dots included', () => {
    yes('*.ts', 'a.ts', '.ts', 'index.test.ts', '.hidden.ts');
    no('*.ts', 'src/a.ts', 'a.tsx');
    yes('src/*', 'src/a', 'src/');
    no('src/*', 'src/a/b');
    yes('a*b*c', 'abc', 'aXbYc', 'abbbc');
    no('a*b*c', 'acb');
  });

  it('** as a whole segment crosses directories', () => {
    yes('**/*.ts', 'a.ts', 'src/a.ts', 'src/deep/er/a.ts');
    no('**/*.ts', 'a.js', 'src/a.tsx');
    yes('src/**/test/*.ts', 'src/test/a.ts', 'src/x/test/a.ts', 'src/x/y/test/a.ts');
    no('src/**/test/*.ts', 'lib/test/a.ts', 'src/xtest/a.ts');
    yes('src/**', 'src/a', 'src/a/b/c');
    no('src/**', 'lib/a', 'srcx/a');
    yes('**', 'a', 'a/b/c', '');
    // Not a whole segment: the same as *.
    yes('a**b', 'ab', 'aXXb');
    no('a**b', 'a/b', 'a/x/b');
    no('x/**b', 'x/y/b');
  });

  it('? is one character but never a slash', () => {
    yes('?.md', 'a.md', 'é.md', '😀.md');
    no('?.md', '.md', 'ab.md', '/.md');
    yes('a?c', 'abc');
    no('a?c', 'a/c');
  });

  it('[...] classes, ranges and negation', () => {
    yes('[ab].txt', 'a.txt', 'b.txt');
    no('[ab].txt', 'c.txt', '[ab].txt', 'ab.txt');
    yes('file[0-9].log', 'file0.log', 'file9.log');
    no('file[0-9].log', 'filea.log', 'file10.log');
    yes('[!a]*', 'bcd', 'zz');
    no('[!a]*', 'abc');
    yes('[^a-c]x', 'dx');
    no('[^a-c]x', 'bx');
    yes('[]]', ']');
    yes('[!]]', 'a');
    no('[!]]', ']');
    yes('[a-]', 'a', '-');
    yes('[-a]', '-');
    yes('[[:digit:]][[:alpha:]]', '1a', '9Z');
    no('[[:digit:]]', 'a');
    yes('[\\]]', ']');
    // Classes never match the separator, even negated.
    no('a[!x]b', 'a/b');
    no('a[/]b', 'a/b');
  });

  it('{a,b} alternatives, nested, with wildcards inside', () => {
    yes('src/*.{js,json}', 'src/a.js', 'src/a.json');
    no('src/*.{js,json}', 'src/a.ts', 'src/a.jso');
    yes('{a,b{c,d{e,f}}}.txt', 'a.txt', 'bc.txt', 'bde.txt', 'bdf.txt');
    no('{a,b{c,d{e,f}}}.txt', 'b.txt', 'bd.txt', 'bdg.txt');
    yes('x.{?s,md}', 'x.ts', 'x.js', 'x.md');
    no('x.{?s,md}', 'x.s', 'x.tss', 'x.m');
    yes('{*.ts,docs/**}', 'a.ts', 'docs/a/b.md');
    no('{*.ts,docs/**}', 'src/a.ts');
    yes('{,pre}fix', 'fix', 'prefix');
    yes('{[ab],c}z', 'az', 'bz', 'cz');
    no('{[ab],c}z', 'dz');
    yes('{**/,}x.ts', 'x.ts', 'a/b/x.ts');
    // A group without a comma is literal text.
    yes('{a}', '{a}');
    no('{a}', 'a');
    yes('a{}b', 'a{}b');
  });

  it('regular-expression characters are literal', () => {
    yes('a+b(c)|d$^.txt', 'a+b(c)|d$^.txt');
    no('a.b', 'axb');
    yes('}', '}');
    yes('a,b', 'a,b');
  });

  it('\\ escapes the next character', () => {
    yes('\\*', '*');
    no('\\*', 'a');
    yes('\\[a]', '[a]');
    yes('\\{a,b}', '{a,b}');
    yes('a\\?', 'a?');
    no('a\\?', 'ab');
  });

  it('segments: false treats the subject as one string', () => {
    expect(matchGlob('https://*.example.com/*', 'https://api.example.com/v1/x', { segments: false })).toBe(true);
    expect(matchGlob('rm -rf *', 'rm -rf /', { segments: false })).toBe(true);
    expect(matchGlob('rm -rf *', 'rm -rf /', {})).toBe(false);
    expect(matchGlob('a?c', 'a/c', { segments: false })).toBe(true);
  });

  it('caseInsensitive folds letters, in classes too', () => {
    expect(matchGlob('*.TXT', 'a.txt', { caseInsensitive: true })).toBe(true);
    expect(matchGlob('[A-C]x', 'bX', { caseInsensitive: true })).toBe(true);
    expect(matchGlob('*.TXT', 'a.txt')).toBe(false);
  });
});

describe('malformed and oversized patterns', () => {
  it('throws a typed syntax error', () => {
    expect(refused('a[bc', 'syntax').position).toBe(1);
    refused('{a,b', 'syntax');
    refused('x{a,{b,c}', 'syntax');
    refused('abc\\', 'syntax');
    refused('[z-a]', 'syntax');
    refused('[[:nope:]]', 'syntax');
  });

  it('refuses patterns beyond the limits', () => {
    refused('a'.repeat(GLOB_LIMITS.maxPatternLength + 1), 'too_complex');
    refused('{'.repeat(GLOB_LIMITS.maxBraceDepth + 1) + 'a,b' + '}'.repeat(GLOB_LIMITS.maxBraceDepth + 1), 'too_complex');
    refused('{a,b}'.repeat(GLOB_LIMITS.maxAlternatives / 2 + 1), 'too_complex');
    expect(() => compileGlob('{a,b}'.repeat(GLOB_LIMITS.maxAlternatives / 2))).not.toThrow();
  });
});

describe('linear time', () => {
  // Patterns that take a backtracking matcher exponential time (tens of seconds to hours).
  const name44 = 'a'.repeat(44);
  const cases: [string, string][] = [
    ['*a*a*a*a*a*a*a*a*a*az', 'a'.repeat(38)],
    [`g/${'*a'.repeat(11)}z`, `g/${name44}`],
    [`${'*a'.repeat(40)}z`, 'a'.repeat(200)],
    [`**/${'*a'.repeat(20)}z`, `${'a/'.repeat(50)}${'a'.repeat(100)}`],
    [`${'{a,*}'.repeat(30)}z`, 'a'.repeat(100)],
  ];

  it.each(cases)('%s never blows up', (pattern, subject) => {
    const glob = compileGlob(pattern);
    const started = performance.now();
    const { matched, steps } = glob.measure(subject);
    const elapsed = performance.now() - started;
    expect(matched).toBe(false);
    // The simulation's own bound: every character visits each NFA state at most twice.
    expect(steps).toBeLessThanOrEqual(2 * glob.size * (subject.length + 1));
    expect(elapsed).toBeLessThan(1000);
  });

  it('work grows linearly with the subject', () => {
    const glob = compileGlob(`${'*a'.repeat(11)}z`);
    const small = glob.measure('a'.repeat(100)).steps;
    const large = glob.measure('a'.repeat(1000)).steps;
    expect(large).toBeLessThanOrEqual(small * 11);
  });

  it('a matcher runs in bounded slices and decides as measure does', () => {
    const glob = compileGlob(`${'*a'.repeat(100)}{z,a}`);
    const m = glob.matcher();
    for (const subject of ['a'.repeat(300), `${'a'.repeat(299)}z`, `${'a'.repeat(50)}z`, '']) {
      m.reset(subject);
      let slices = 1;
      while (!m.run(1000)) slices++;
      const whole = glob.measure(subject);
      expect(m.matched).toBe(whole.matched);
      expect(m.steps).toBe(whole.steps);
      // Each slice stops within one character's work (at most 2 × size steps) of its budget.
      expect(m.steps).toBeLessThanOrEqual(slices * (1000 + 2 * glob.size));
      if (whole.steps > 1000 + 2 * glob.size) expect(slices).toBeGreaterThan(1);
    }
    expect(m.run(1000)).toBe(true);
  });

  it('still matches where it should', () => {
    expect(matchGlob(`g/${'*a'.repeat(11)}z`, `g/${'a'.repeat(44)}z`)).toBe(true);
    expect(matchGlob('*a*a*a*a*a*a*a*a*a*az', `${'a'.repeat(38)}z`)).toBe(true);
  });
});
