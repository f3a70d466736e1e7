import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import type { Logger } from '@agentplane/core';
import { Supervisor, type FatalExit } from '../platform/dist/supervisor.js';
import { waitFor } from './harness/platform.js';

/**
 * The supervisor's stop of a child that does not stop: SIGTERM, SIGTERM again when its spec asks,
 * then SIGKILL at the end of its grace period, each step logged.
 */
const dir = mkdtempSync(join(tmpdir(), 'agentplane-supervisor-'));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

interface Logged { level: 'info' | 'warn'; fields: Record<string, unknown>; msg: string }

/**
 * A logger that keeps its lines. Its `flush` (the lines written) answers at once, or, with
 * `hold`, only when the test calls the flush it was handed.
 */
function recorder(options: { hold?: (flushed: () => void) => void } = {}): { log: Logger; lines: Logged[] } {
  const lines: Logged[] = [];
  const at = (level: Logged['level']) => (fields: Record<string, unknown>, msg: string) => lines.push({ level, fields, msg });
  const flush = (cb?: () => void): void => {
    if (options.hold) options.hold(() => cb?.());
    else cb?.();
  };
  const log = { info: at('info'), warn: at('warn'), error: at('warn'), debug: () => undefined, flush } as unknown as Logger;
  return { log, lines };
}

describe('platform supervisor', () => {
  it('a child that ignores SIGTERM gets it again, then SIGKILL at its grace period, and the log says so', async () => {
    const script = join(dir, 'stubborn.mjs');
    const count = join(dir, 'signals');
    writeFileSync(count, '0');
    writeFileSync(script, `import { writeFileSync } from 'node:fs';
let n = 0;
process.on('SIGTERM', () => writeFileSync(${JSON.stringify(count)}, String(++n)));
writeFileSync(${JSON.stringify(count)}, 'ready');
setInterval(() => undefined, 1000);
`);
    const { log, lines } = recorder();
    const supervisor = new Supervisor(log, false);
    const proc = supervisor.start({ name: 'stubborn', script, env: {}, stopGraceMs: 1500, secondSignalAfterMs: 500 });
    await waitFor('the child to start', () => (readFileSync(count, 'utf8') === 'ready' ? true : undefined), 30_000);
    const [result] = await supervisor.stopStage(['stubborn']);
    expect(result).toMatchObject({ name: 'stubborn', killed: true });
    expect(proc.signalCode).toBe('SIGKILL');
    expect(readFileSync(count, 'utf8')).toBe('2');
    expect(lines.map((l) => `${l.level} ${l.msg}`)).toEqual([
      'info stopping platform process',
      'warn platform process still stopping; sending SIGTERM again',
      'warn platform process did not stop in time; killing it (SIGKILL)',
      'info platform process stopped',
    ]);
    expect(lines[2]?.fields).toMatchObject({ child: 'stubborn', after_ms: 1500 });
  });

  it('stops stage by stage: the next stage starts once the one before has exited', async () => {
    const script = join(dir, 'polite.mjs');
    writeFileSync(script, `process.on('SIGTERM', () => setTimeout(() => process.exit(0), 300));
setInterval(() => undefined, 1000);
`);
    const { log, lines } = recorder();
    const supervisor = new Supervisor(log, false);
    for (const name of ['first', 'second', 'third']) supervisor.start({ name, script, env: {}, stopGraceMs: 10_000 });
    await supervisor.stopStage(['first']);
    await supervisor.stopStage(['second', 'third']);
    const order = lines.map((l) => `${l.msg === 'platform process stopped' ? 'stopped' : 'stopping'} ${String(l.fields.child)}`);
    expect(order.slice(0, 2)).toEqual(['stopping first', 'stopped first']);
    expect(order.slice(2, 4).sort()).toEqual(['stopping second', 'stopping third']);
    expect(order.slice(4).sort()).toEqual(['stopped second', 'stopped third']);
    expect(lines.every((l) => l.level === 'info')).toBe(true);
  });

  it('signals no child of a stage before the lines logged up to its stop are written (children share its stdout)', async () => {
    const script = join(dir, 'polite.mjs');
    writeFileSync(script, `process.on('SIGTERM', () => process.exit(0));
setInterval(() => undefined, 1000);
`);
    const steps: string[] = [];
    // The write completes a turn of the event loop after it was asked for: a stop that signalled
    // without waiting for it would have signalled by then.
    const { log, lines } = recorder({ hold: (flushed) => {
      steps.push('flush asked');
      setImmediate(() => {
        steps.push('flushed');
        flushed();
      });
    } });
    const supervisor = new Supervisor(log, false);
    const proc = supervisor.start({ name: 'polite', script, env: {}, stopGraceMs: 10_000 });
    const kill = proc.kill.bind(proc);
    proc.kill = (signal?: NodeJS.Signals | number) => {
      steps.push(`kill ${String(signal)}`);
      return kill(signal);
    };
    const [result] = await supervisor.stopStage(['polite']);
    expect(result).toMatchObject({ name: 'polite', killed: false });
    expect(steps).toEqual(['flush asked', 'flushed', 'kill SIGTERM']);
    expect(lines.map((l) => l.msg)).toEqual(['stopping platform process', 'platform process stopped']);
  });
});

/**
 * Giving up on a child: one that exits before it was ever up (its first start failed) is not
 * restarted, nor one that keeps crashing; one that was up and crashes is restarted.
 */
describe('platform supervisor: a child that cannot start', () => {
  /** A script that counts its lives in `lives`, and per life does what `plan[life]` says (the last entry after that). */
  function scripted(name: string, plan: Array<'fail' | 'listen-then-crash' | 'listen'>): { script: string; lives: () => number } {
    const script = join(dir, `${name}.mjs`);
    const lives = join(dir, `${name}.lives`);
    writeFileSync(lives, '0');
    writeFileSync(script, `import { readFileSync, writeFileSync } from 'node:fs';
import { createServer } from 'node:net';
const life = Number(readFileSync(${JSON.stringify(lives)}, 'utf8')) + 1;
writeFileSync(${JSON.stringify(lives)}, String(life));
const plan = ${JSON.stringify(plan)};
const what = plan[Math.min(life, plan.length) - 1];
if (what === 'fail') {
  process.stderr.write('warming up\\n${name} failed to start: listen EADDRINUSE: address already in use 127.0.0.1:8080\\n');
  process.exit(1);
}
const server = createServer().listen(0, '127.0.0.1', () => {
  if (what === 'listen-then-crash') setImmediate(() => { process.stderr.write('crashed in life ' + life + '\\n'); process.exit(3); });
});
setInterval(() => undefined, 1000);
`);
    return { script, lives: () => Number(readFileSync(lives, 'utf8')) };
  }

  function fatalPromise(): { options: { onFatal: (f: FatalExit) => void }; fatal: Promise<FatalExit>; count: () => number } {
    let n = 0;
    let resolve!: (f: FatalExit) => void;
    const fatal = new Promise<FatalExit>((r) => (resolve = r));
    return { options: { onFatal: (f) => { n += 1; resolve(f); } }, fatal, count: () => n };
  }

  it('gives up on a child that exits before it was ready, naming its last error; it is not restarted', async () => {
    const { script, lives } = scripted('api-in-use', ['fail']);
    const { log, lines } = recorder();
    const f = fatalPromise();
    const supervisor = new Supervisor(log, true, () => undefined, f.options);
    supervisor.start({ name: 'api', script, env: {}, stopGraceMs: 5000, ready: 'listen' });
    const fatal = await f.fatal;
    expect(fatal).toEqual({
      child: 'api', reason: 'exited before it was ready', code: 1, signal: null,
      error: 'api-in-use failed to start: listen EADDRINUSE: address already in use 127.0.0.1:8080',
    });
    expect(lives()).toBe(1);
    expect(lines.map((l) => l.msg)).toEqual(['platform process exited']);
    await supervisor.stopRest();
    expect(lives()).toBe(1);
    expect(f.count()).toBe(1);
  });

  it('restarts a child that was up and crashed (ready once it listened)', async () => {
    const { script, lives } = scripted('crash-once', ['listen-then-crash', 'listen']);
    const { log } = recorder();
    const f = fatalPromise();
    let second: () => void = () => undefined;
    const secondLife = new Promise<void>((r) => (second = r));
    let supervisor: Supervisor | undefined;
    const pids = new Set<number>();
    supervisor = new Supervisor(log, true, () => {
      const pid = supervisor?.pids().child;
      if (pid) pids.add(pid);
      if (pids.size === 2) second();
    }, f.options);
    supervisor.start({ name: 'child', script, env: {}, stopGraceMs: 5000, ready: 'listen' });
    await secondLife;
    await waitFor('the second life up', () => (supervisor?.isReady('child') ? true : undefined), 30_000);
    expect(lives()).toBe(2);
    await supervisor.stopRest();
    expect(f.count()).toBe(0);
  });

  it('gives up on a child that keeps crashing after it was up', async () => {
    const { script, lives } = scripted('crash-loop', ['listen-then-crash']);
    const { log } = recorder();
    const f = fatalPromise();
    const supervisor = new Supervisor(log, true, () => undefined, { ...f.options, maxCrashes: 3, crashWindowMs: 60_000 });
    supervisor.start({ name: 'scheduler', script, env: {}, stopGraceMs: 5000, ready: 'listen' });
    const fatal = await f.fatal;
    expect(fatal).toEqual({ child: 'scheduler', reason: 'exited 3 times within 60 s', code: 3, signal: null, error: 'crashed in life 3' });
    expect(lives()).toBe(3);
    await supervisor.stopRest();
    expect(lives()).toBe(3);
  });
});
