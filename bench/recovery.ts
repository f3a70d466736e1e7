// bench:recovery — how soon an interrupted Run runs again after a whole-platform crash: every
// process (supervisor, embedded Redis, API, scheduler, local runner) killed with SIGKILL while a
// Run's tool call is in its sandbox, then the platform started again on the same data, as
// `npm start` would. Default settings (a 30 s lease, renewed every 10 s), so only the restarted
// runner's report of the leases it no longer holds can end the lost attempt early.
//
// Reported per round: restart → the runner ready; the runner ready → the Run rescheduled (the
// `session.thread_status_rescheduled` event); restart → the Run's second attempt running.
// Floor, measured in the same run on the same Redis: a raw BullMQ Worker (default settings: a
// 30 s lock) killed with SIGKILL while it processes a job, and a new Worker started: how long
// until the new Worker processes the job again (its stalled-job check, then the job's lock lapse).
// Needs Docker (the Run's tool call runs in a sandbox). Takes two to three minutes.
import { spawn } from 'node:child_process';
import { rmSync } from 'node:fs';
import { resolve } from 'node:path';
import { Queue, Worker } from 'bullmq';
import { Redis } from 'ioredis';
import scopeSandboxes from '../test/harness/global-teardown.js';
import { startPlatform, waitFor } from '../test/harness/platform.js';
import { killWholePlatform, startToolCallTurn, waitThreadEvents } from '../test/harness/whole-crash.js';
import { printTable, summarize, wallMs } from './lib/report.js';
import { benchHelp } from './lib/help.js';

benchHelp(import.meta.url);

const ROUNDS = Math.max(1, Number(process.env.BENCH_RECOVERY_ROUNDS ?? 3));
const ROOT = resolve(import.meta.dirname, '..');
const out = (line: string) => process.stdout.write(`${line}\n`);
interface Round { runnerReady: number; rescheduled: number; running: number; once: boolean }

async function ourRound(i: number): Promise<{ round: Round; redisUrl: string; stop: () => Promise<void> }> {
  const p = await startPlatform({ runner: true, scheduler: true, env: { LOG_LEVEL: 'warn' } });
  const sessionId = await startToolCallTurn(p, 2);
  await killWholePlatform(p);

  const restart = wallMs();
  const second = await startPlatform({ runner: true, scheduler: true, env: { LOG_LEVEL: 'warn' }, dataDir: p.dataDir, port: p.port });
  const api = second.root;
  const ready = await waitFor('the local runner back', async () => {
    const r = (await api.get<{ data: { status: string }[] }>('/v1/runner-pools/presences')).data.some((x) => x.status === 'ready');
    return r ? wallMs() : undefined;
  }, 60_000);
  const evs = await waitThreadEvents(api, sessionId, (e) => e.filter((x) => x.type === 'session.status_running').length >= 2, 120_000);
  const at = (type: string, nth = 0) => Date.parse(evs.filter((x) => x.type === type)[nth]?.created_at ?? '');
  const end = await waitThreadEvents(api, sessionId, (e) => e.some((x) => x.type === 'session.status_idle'), 120_000).catch(() => []);
  // Done once: one Run, its lost attempt and the one that succeeded, and one reply.
  const runs = (await api.get<{ data: { status: string; attempts: { outcome: string }[] }[] }>(`/v1/sessions/${sessionId}/runs`)).data;
  const once = end.filter((x) => x.type === 'agent.message').length === 1 && runs.length === 1 && runs[0]?.status === 'succeeded'
    && runs[0].attempts.map((a) => a.outcome).join() === 'lost,succeeded';
  const round = {
    runnerReady: ready - restart,
    rescheduled: at('session.thread_status_rescheduled') - ready,
    running: at('session.status_running', 1) - restart,
    once,
  };
  out(`  round ${i + 1}: runner ready ${round.runnerReady.toFixed(0)} ms after the restart, Run rescheduled ${round.rescheduled.toFixed(0)} ms after that, running again ${round.running.toFixed(0)} ms after the restart${once ? '' : ' (the Run did not finish exactly once)'}`);
  return {
    round,
    redisUrl: second.redisUrl(),
    stop: async () => {
      await second.stop();
      rmSync(p.dataDir, { recursive: true, force: true });
    },
  };
}

/** A Worker in a child process with BullMQ's defaults; says `active` once it processes a job, then holds it. */
const HOLDER = `
import { Worker } from 'bullmq';
import { Redis } from 'ioredis';
const [, url, queue] = process.argv;
const connection = new Redis(url, { maxRetriesPerRequest: null });
new Worker(queue, async () => { process.send('active'); await new Promise(() => {}); }, { connection });
`;

async function floorRound(url: string): Promise<number> {
  const name = `{bench-recovery-floor}-${Date.now()}`;
  const connection = new Redis(url, { maxRetriesPerRequest: null });
  const queue = new Queue(name, { connection });
  const child = spawn(process.execPath, ['--input-type=module', '-e', HOLDER, url, name], {
    cwd: ROOT, stdio: ['ignore', 'inherit', 'inherit', 'ipc'],
  });
  await queue.add('job', {});
  await new Promise<void>((res, rej) => {
    child.once('message', () => res());
    child.once('exit', (code) => rej(new Error(`the holding worker exited (${code})`)));
  });
  child.kill('SIGKILL');
  await new Promise((r) => child.once('exit', r));
  const start = wallMs();
  let taken = 0;
  // The Worker's own connection, closed here: a Worker does not close a connection it was given.
  const workerConnection = new Redis(url, { maxRetriesPerRequest: null });
  const again = new Promise<void>((res) => {
    const w = new Worker(name, async () => {
      taken = wallMs() - start;
      res();
      await w.close(true).catch(() => undefined);
    }, { connection: workerConnection });
  });
  await again;
  workerConnection.disconnect();
  await queue.obliterate({ force: true }).catch(() => undefined);
  await queue.close();
  connection.disconnect();
  return taken;
}

async function main(): Promise<void> {
  // The sandboxes of the runners each round kills (and their workspaces) are labelled with a scope
  // of this run's own and removed at the end, as the test suite removes its own; so is its temp root.
  const removeScoped = scopeSandboxes();
  try {
    await measure();
  } finally {
    await removeScoped();
  }
}

async function measure(): Promise<void> {
  out(`bench:recovery  (${ROUNDS} rounds of a whole-platform kill -9 mid-Run; default settings: 30 s lease)`);
  const rounds: Round[] = [];
  let last: Awaited<ReturnType<typeof ourRound>> | undefined;
  for (let i = 0; i < ROUNDS; i++) {
    if (last) await last.stop();
    last = await ourRound(i);
    rounds.push(last.round);
  }
  if (!last) return;
  out('floor: a raw BullMQ Worker killed mid-job, a new one started (defaults: 30 s lock) …');
  let floor = Number.NaN;
  try {
    floor = await floorRound(last.redisUrl);
    out(`  the new Worker processed the job ${floor.toFixed(0)} ms after it started`);
  } finally {
    await last.stop();
  }
  const med = (k: keyof Omit<Round, 'once'>) => summarize(rounds.map((r) => r[k])).p50;
  printTable('recovery after a whole-platform crash (medians of the rounds) vs a raw BullMQ worker\'s restart', [
    { metric: 'restart → Run running again', ours: med('running'), floor, unit: 'ms' },
    { metric: 'runner ready → Run rescheduled', ours: med('rescheduled'), floor, unit: 'ms' },
  ]);
  out(`restart → runner ready: ${rounds.map((r) => r.runnerReady.toFixed(0)).join(', ')} ms; Runs done exactly once (one Run: a lost attempt, then one that succeeded; one reply): ${rounds.filter((r) => r.once).length} of ${rounds.length}`);
}

main().then(() => process.exit(0), (err: unknown) => {
  process.stderr.write(`${err instanceof Error ? err.stack ?? err.message : String(err)}\n`);
  process.exit(1);
});
