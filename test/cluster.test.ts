import { execFile, type ChildProcess } from 'node:child_process';
import { promisify } from 'node:util';
import { cpSync, mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { HttpClient } from '@agentplane/client';
import { LeaseRecords } from '@agentplane/lease';
import { AppendNotReplicatedError, connectRedis, EventHub, EventLog, eventLogKeys, keys, LuaScript, tags, type HubMessage, type Redis } from '@agentplane/store';
import { RUNNER_CLI, startDaemon } from './harness/daemon.js';
import { startApiNode, startFailoverProxy, startSchedulerNode, type ApiNode, type FailoverProxy, type NodeProcess } from './harness/cluster-platform.js';
import { startPlatform, waitFor, type Platform } from './harness/platform.js';
import { startRedisCluster, type RedisClusterHandle } from './harness/redis-cluster.js';
import { FAST_LEASES, SCRIPT, untilEvents, type TurnEvent } from './harness/turns.js';

/**
 * The platform on a 6-node Redis Cluster (3 masters, 3 replicas) with three API nodes and two
 * schedulers: node A is the platform's own API (bootstrap, supervised scheduler), B and C are
 * further API processes; a second scheduler runs beside the first. The runner reaches the API
 * through a failover proxy that prefers C, so its socket lives on C while the tests POST on A
 * and read the stream on B.
 */
let cluster: RedisClusterHandle;
let p: Platform;
let b: ApiNode;
let c: ApiNode;
let scheduler2: NodeProcess;
let proxy: FailoverProxy;
let redis: Redis;
let principal: string;
let envId: string;
let onA: HttpClient;
let onB: HttpClient;
let runnerDir: string;
let runnerId: string;
let daemon: ChildProcess | undefined;
const extraNodes: ApiNode[] = [];

// Every append waits for one replica (docs/CLUSTER.md): the guarantee the failover test checks.
const ENV = { ...FAST_LEASES, LOG_LEVEL: process.env.TEST_LOG_LEVEL ?? 'warn', EVENT_APPEND_WAIT_REPLICAS: '1', EVENT_APPEND_WAIT_TIMEOUT_MS: '1000' };

async function pairThrough(url: string, label: string): Promise<{ dir: string; runnerId: string }> {
  const r = await p.root.request<{ code: string }>('POST', '/v1/runner-pairings', {
    idempotencyKey: `pair-${label}`, body: { principal_id: principal, machine_label: label, expires_in_seconds: 300 },
  });
  if (r.status !== 201) throw new Error(`pairing failed: ${r.status} ${JSON.stringify(r.body)}`);
  const dir = mkdtempSync(join(tmpdir(), 'runner-cluster-'));
  // Not spawnSync: the proxy it goes through runs in this process.
  const out = await promisify(execFile)(process.execPath, [RUNNER_CLI, 'pair', '--code', r.body.code, '--url', url, '--config-dir', dir, '--label', label, '--json'], { encoding: 'utf8', timeout: 30_000 });
  return { dir, runnerId: (JSON.parse(out.stdout) as { runner_id: string }).runner_id };
}

async function readyRunner(): Promise<void> {
  await waitFor('the runner ready', async () => {
    const r = await onA.get<{ data: { runner: string; status: string }[] }>('/v1/runner-pools/presences');
    return r.data.some((x) => x.runner === runnerId && x.status === 'ready') ? true : undefined;
  }, 60_000);
}

const msg = (content: string) => ({ type: 'user.message' as const, payload: { content, authored_by: principal, caused_by: { kind: 'api' } } });

async function newSession(api: HttpClient, system = SCRIPT([{ when: { user_contains: 'hello' }, then: [{ reply: 'hi from the cluster' }] }])): Promise<string> {
  return (await api.post<{ id: string }>('/v1/sessions', { agent: { name: 'a', model: 'default', system }, environment_id: envId })).id;
}

beforeAll(async () => {
  cluster = await startRedisCluster();
  p = await startPlatform({ runner: false, scheduler: true, env: { ...ENV, REDIS_URL: cluster.url } });
  [b, c] = await Promise.all([startApiNode(p, cluster.url, 'api-b', ENV), startApiNode(p, cluster.url, 'api-c', ENV)]);
  scheduler2 = startSchedulerNode(p, cluster.url, 'scheduler-2', ENV);
  redis = connectRedis(cluster.url, { name: 'cluster-test' });
  onA = p.root;
  onB = b.root;
  principal = (await onA.post<{ id: string }>(`/v1/organizations/workspaces/${p.bootstrap.workspace_id}/principals`, {
    external_subject_id: 'owner', principal_type: 'person', display_name: 'Owner',
  })).id;
  envId = (await onA.post<{ id: string }>('/v1/environments', {
    name: 'sandbox', image: 'agentplane/sandbox:latest', resources: { cpu_millis: 1000, memory_mib: 256, disk_mib: 512, max_duration_seconds: 120 },
  })).id;
  // The runner's connections go to C while C lives, then to B, then to A.
  proxy = await startFailoverProxy([c.port, b.port, p.port]);
  ({ dir: runnerDir, runnerId } = await pairThrough(proxy.url, 'cluster-box'));
  // Its log beside the platform's (CLUSTER_TEST_LOGS keeps both).
  daemon = startDaemon(runnerDir, [], join(p.dataDir, 'runner.log'));
  await readyRunner();
}, 150_000);

afterAll(async () => {
  // CLUSTER_TEST_LOGS=<dir>: keep every node's log there (the test temp root is removed).
  if (process.env.CLUSTER_TEST_LOGS && p) cpSync(p.dataDir, process.env.CLUSTER_TEST_LOGS, { recursive: true, filter: (f) => !f.endsWith('.key') });
  daemon?.kill('SIGKILL');
  await proxy?.close();
  redis?.disconnect();
  await Promise.all([scheduler2?.stop(), b?.stop(), c?.stop(), ...extraNodes.map((n) => n.stop())]);
  await p?.stop();
  await cluster?.stop();
}, 90_000);

describe('the platform on a Redis Cluster with several API nodes and schedulers', () => {
  it('runs a turn end to end: POST on node A, the stream on node B, the runner on node C; every event in order', async () => {
    expect(proxy.routed.at(-1)).toBe(c.port);
    const id = await newSession(onA);
    const stream = untilEvents(onB, id, (e) => e.some((x) => x.type === 'session.status_idle'), 60_000);
    await onA.post(`/v1/sessions/${id}/events`, msg('hello there'));
    const events = await stream;
    expect(events.map((e) => e.type)).toContain('agent.message');
    expect(JSON.stringify(events.filter((e) => e.type === 'agent.message'))).toContain('hi from the cluster');
    expect(events.find((e) => e.type === 'session.status_idle')?.payload.stop_reason).toMatchObject({ type: 'end_turn' });
    const seqs = events.map((e) => e.seq);
    expect(seqs).toEqual([...seqs].sort((x, y) => x - y));
    expect(new Set(seqs).size).toBe(seqs.length);
    // The same log read on node C (replay) is the same sequence.
    const replay = await untilEvents(c.root, id, (e) => e.length >= events.length, 20_000);
    expect(replay.map((e) => e.id)).toEqual(events.map((e) => e.id));
  });

  it('runs many Runs with two schedulers and never leases one twice', async () => {
    const ids = await Promise.all(Array.from({ length: 12 }, () => newSession(onA)));
    await Promise.all(ids.map((id, i) => (i % 2 ? onA : onB).post(`/v1/sessions/${id}/events`, msg('hello'))));
    for (const id of ids) {
      const runs = await waitFor(`the Run of ${id}`, async () => {
        const r = await onB.get<{ data: { status: string; attempts: { outcome: string; lease_id: string }[] }[] }>(`/v1/sessions/${id}/runs`);
        return r.data.length > 0 && r.data.every((x) => x.status === 'succeeded') ? r.data : undefined;
      }, 90_000);
      expect(runs).toHaveLength(1);
      expect(runs[0]!.attempts).toHaveLength(1);
      expect(runs[0]!.attempts[0]!.outcome).toBe('succeeded');
    }
  }, 120_000);

  it('refuses a Lua script whose keys cross slots; a script inside one hash tag runs', async () => {
    const script = new LuaScript('test:two-keys', "redis.call('SET', KEYS[1], ARGV[1]); redis.call('SET', KEYS[2], ARGV[1]); return 1");
    const ws = tags.workspace('wrkspc_cross');
    const crossing = [keys.scoped(ws, 'a'), keys.scoped(tags.session('sess_other'), 'b')];
    // The cluster client refuses it before sending; a plain connection to the right master gets
    // the server's own refusal.
    await expect(script.run(redis, crossing, ['x'])).rejects.toThrow(/CROSSSLOT|same slot/);
    const direct = cluster.node(await cluster.masterOf(crossing[0]!));
    await expect(script.run(direct, crossing, ['x'])).rejects.toThrow(/CROSSSLOT/);
    await expect(script.run(redis, [keys.scoped(ws, 'a'), keys.scoped(ws, 'b')], ['x'])).resolves.toBe(1);
    // An undeclared key in another slot is refused by the server as well.
    const sneaky = new LuaScript('test:undeclared', "redis.call('SET', KEYS[1], '1'); return redis.call('GET', ARGV[1])");
    await expect(sneaky.run(redis, [keys.scoped(ws, 'a')], [keys.scoped(tags.session('sess_far_away'), 'x')])).rejects.toThrow(/slot|non local|cluster/i);
  });

  it('writes the commands of one turn to each master in one socket write', async () => {
    const masters = (redis as unknown as { nodes(role: 'master'): Redis[] }).nodes('master');
    expect(masters.length).toBeGreaterThanOrEqual(3);
    await Promise.all(masters.map((m) => m.ping()));
    const writes = masters.map((m) => {
      const socket = (m as unknown as { stream: { _write: (...a: unknown[]) => void; _writev?: (...a: unknown[]) => void } }).stream;
      const counter = { n: 0 };
      const write = socket._write.bind(socket);
      socket._write = (...a: unknown[]) => { counter.n++; write(...a); };
      const writev = socket._writev?.bind(socket);
      if (writev) socket._writev = (...a: unknown[]) => { counter.n++; writev(...a); };
      return counter;
    });
    // Sixty keys in sixty hash tags: spread over every master, twenty or so each, in one turn.
    const tagged = Array.from({ length: 60 }, (_, i) => keys.scoped(tags.session(`sess_tick${i}`), 'x'));
    await Promise.all(tagged.map((k) => redis.set(k, '1')));
    expect(writes.map((w) => w.n)).toEqual(masters.map(() => 1));
  });

  it('writes, finds and removes a lease record whose runner index lives on another master', async () => {
    // Two hash tags on two masters: a pipeline across them is refused by the cluster client, so
    // the record and the index must go out as separate commands (this failed most offers once).
    const records = new LeaseRecords(redis);
    const runner = 'runner_records_across_masters';
    const index = keys.global(`runner_leases:${runner}`);
    let leaseId = '';
    for (let i = 0; !leaseId && i < 200; i++) {
      if ((await cluster.masterOf(keys.global(`lease:l${i}`))) !== (await cluster.masterOf(index))) leaseId = `l${i}`;
    }
    expect(leaseId).not.toBe('');
    const record = { lease_id: leaseId, run_id: 'run_x', session_id: 'sess_x', thread_id: 'sthr_x', workspace_id: 'wrkspc_x', pool_id: 'rpool_x', attempt: 1, runner_id: runner, reply_to: 'ap:x' };
    await records.put(record, 60_000);
    expect(await records.get(leaseId)).toEqual(record);
    expect(await records.orphansOf(runner, new Set())).toEqual([record]);
    await records.remove(leaseId, runner);
    expect(await records.get(leaseId)).toBeNull();
    expect(await redis.smembers(index)).toEqual([]);
  });

  const SLOW_TOOL = SCRIPT([
    { when: { user_contains: 'go' }, then: [{ tool: 'bash', input: { command: 'sleep 4; echo finished' } }] },
    { when: { on: 'tool_result' }, then: [{ reply: 'done: {{tool_result}}' }] },
  ]);
  const bashSession = async (): Promise<string> => (await onA.post<{ id: string }>('/v1/sessions', {
    agent: { name: 'a', model: 'default', tools: [{ type: 'builtin', name: 'bash' }], system: SLOW_TOOL }, environment_id: envId,
  })).id;
  /** Where a turn that did not end stands: its Runs, their jobs, the runner's presence (a failure's message). */
  const stuckTurn = async (id: string): Promise<string> => {
    const read = (f: () => Promise<unknown>) => f().then((v) => JSON.stringify(v), (err: unknown) => `(${String(err)})`);
    const runs = await onB.get<{ data: { id: string; runner_pool_id?: string | null }[] }>(`/v1/sessions/${id}/runs`).catch(() => ({ data: [] }));
    const jobs = await Promise.all(runs.data.map((r) => read(async () => {
      const pool = r.runner_pool_id ?? (await onA.get<{ data: { id: string }[] }>('/v1/runner-pools', { limit: 100 })).data[0]?.id;
      const { data: _data, ...job } = await redis.hgetall(`ap:{q:${pool}}:runs:${r.id}`);
      return job;
    })));
    return `runs ${JSON.stringify(runs.data)}; jobs ${jobs.join(', ')}; threads ${await read(() => onB.get(`/v1/sessions/${id}/threads`))}; presences ${await read(() => onB.get('/v1/runner-pools/presences'))}; at ${Date.now()}`;
  };
  const runsOf = async (id: string) => (await onB.get<{ data: { status: string; attempts: { outcome: string }[] }[] }>(`/v1/sessions/${id}/runs`)).data;

  it('delivers an interrupt and a drain posted on node A to the runner whose socket is on node C', async () => {
    const id = (await onA.post<{ id: string }>('/v1/sessions', {
      agent: { name: 'a', model: 'default', tools: [{ type: 'builtin', name: 'bash' }], system: SCRIPT([{ when: { user_contains: 'sleep' }, then: [{ tool: 'bash', input: { command: 'sleep 600' } }] }]) },
      environment_id: envId,
    })).id;
    const events: TurnEvent[] = [];
    // The turn's start (a sandbox) can take long on a loaded machine; the interrupt's own bound is
    // checked below.
    const stream = untilEvents(onB, id, (e) => { events.splice(0, events.length, ...e); return e.some((x) => x.type === 'session.status_idle'); }, 120_000);
    await onA.post(`/v1/sessions/${id}/events`, msg('sleep please'));
    await waitFor('the tool call', () => (events.some((e) => e.type === 'agent.tool_use') ? true : undefined), 100_000);
    const started = Date.now();
    await onA.post(`/v1/sessions/${id}/events`, { type: 'user.interrupt', payload: { authored_by: principal, caused_by: { kind: 'api' } } });
    await stream;
    expect(Date.now() - started).toBeLessThan(15_000);
    expect(events.find((e) => e.type === 'session.status_idle')?.payload.stop_reason).toMatchObject({ type: 'interrupted' });

    const status = (want: string) => waitFor(`runner ${want}`, async () => {
      const r = await onB.get<{ data: { runner: string; status: string }[] }>('/v1/runner-pools/presences');
      return r.data.some((x) => x.runner === runnerId && x.status === want) ? true : undefined;
    }, 30_000);
    expect((await onA.request('POST', `/v1/runners/${runnerId}/drain`, { body: { deadline_seconds: 60, reason: 'maintenance' } })).status).toBe(200);
    await status('draining');
    expect((await onA.request('POST', `/v1/runners/${runnerId}/resume`)).status).toBe(200);
    await status('ready');
  }, 180_000);

  it('survives kill -9 of the API node holding the runner socket: the runner reconnects to another node within the bound and its held lease survives', async () => {
    const id = await bashSession();
    const events: TurnEvent[] = [];
    const stream = untilEvents(onB, id, (e) => { events.splice(0, events.length, ...e); return e.some((x) => x.type === 'session.status_idle'); }, 90_000);
    await onA.post(`/v1/sessions/${id}/events`, msg('go'));
    await waitFor('the tool call', () => (events.some((e) => e.type === 'agent.tool_use') ? true : undefined), 60_000);
    const routedBefore = proxy.routed.length;
    const killedAt = Date.now();
    await c.kill();
    // The runner's next connection goes to B (C refuses): how long it was without a gateway.
    await waitFor('the runner reconnected to node B', () => (proxy.routed.slice(routedBefore).includes(b.port) ? true : undefined), 20_000);
    const reconnectMs = Date.now() - killedAt;
    process.stdout.write(`cluster: runner back on another API node ${reconnectMs} ms after kill -9 of its node\n`);
    await stream;
    expect(JSON.stringify(events.filter((e) => e.type === 'agent.message'))).toContain('finished');
    expect(events.find((e) => e.type === 'session.status_idle')?.payload.stop_reason).toMatchObject({ type: 'end_turn' });
    // One attempt: the lease held across the reconnect, no reschedule.
    expect(events.filter((e) => e.type === 'session.thread_status_rescheduled')).toHaveLength(0);
    const runs = await runsOf(id);
    expect(runs[0]!.attempts).toHaveLength(1);
    expect(runs[0]!.attempts[0]!.outcome).toBe('succeeded');
    // docs/CLUSTER.md: the reconnect backoff's first step (here 200 ms, capped at 1 s) plus connect.
    expect(reconnectMs).toBeLessThan(10_000);
  }, 120_000);

  it('moves the event hub with its cluster subscriber: when the node holding it dies, viewers are told to resync and appends arrive live again', async () => {
    const sub = redis.duplicate({ connectionName: 'agentplane:hub-move-test', maxRetriesPerRequest: null });
    sub.on('error', () => undefined);
    const hub = new EventHub(sub);
    const got: HubMessage[] = [];
    const sessionId = `sess_hubmove${Date.now().toString(36)}`;
    const w = await hub.watch(sessionId, (m) => got.push(m));
    // The node whose connection holds the hub's pattern subscription.
    const holder = async (): Promise<number | undefined> => {
      for (const port of cluster.ports) {
        const node = cluster.node(port);
        const list = String(await node.call('CLIENT', 'LIST').catch(() => ''));
        node.disconnect();
        if (list.split('\n').some((l) => l.includes('hub-move-test') && / psub=[1-9]/.test(l))) return port;
      }
      return undefined;
    };
    const port = await waitFor('the hub subscribed on some node', holder, 10_000);
    const log = new EventLog(redis);
    // A master's replica must take its slots over before it comes back: restarted earlier (the
    // nodes keep no data), it would serve them again, empty.
    const replica = await cluster.replicaOf(port);
    try {
      await cluster.kill(port);
      await waitFor('a resync', () => (got.some((m) => m.kind === 'resync') ? true : undefined), 30_000);
      expect(await waitFor('the subscription on another node', async () => { const at = await holder(); return at !== undefined && at !== port ? at : undefined; }, 10_000)).not.toBe(port);
      // The Session's slot may have been on the killed master: append once it is writable again.
      await waitFor('an append', () => log.append(sessionId, [{ type: 'agent.message', payload: { n: 1 }, session_thread_id: null }]).then((r) => (r.ok ? true : undefined), () => undefined), 30_000);
      await waitFor('the append heard live', () => (got.some((m) => m.kind === 'events') ? true : undefined), 10_000);
    } finally {
      w.close();
      await hub.close();
      if (replica !== undefined) {
        await waitFor('the replica promoted', async () => ((await cluster.nodes().catch(() => [])).some((n) => n.port === replica && n.role === 'master') ? true : undefined), 30_000);
      }
      await cluster.restart(port);
      await cluster.waitHealthy(60_000);
    }
  }, 150_000);

  it('fails a Redis master over mid-turn: the turn completes and no acknowledged event is lost (appends wait for a replica)', async () => {
    // Every master with a replica in sync (an earlier test may have restarted a node).
    await cluster.waitHealthy(60_000);
    let id = await bashSession();
    // The Session's slot must have a replica to promote.
    for (let i = 0; (await cluster.replicaOf(await cluster.masterOf(eventLogKeys.stream(id)))) === undefined && i < 20; i++) id = await bashSession();
    const master = await cluster.masterOf(eventLogKeys.stream(id));
    const replica = await cluster.replicaOf(master);
    expect(replica).toBeDefined();
    const seen: TurnEvent[] = [];
    // Read as an SSE client does: a stream that ends early (its node gave up reading a failing
    // master) is opened again after the last event it delivered.
    const stream = (async () => {
      const deadline = Date.now() + 120_000;
      while (Date.now() < deadline && !seen.some((x) => x.type === 'session.status_idle')) {
        const before = [...seen];
        try {
          await untilEvents(onB, id, (e) => { seen.splice(0, seen.length, ...before, ...e); return e.some((x) => x.type === 'session.status_idle'); }, deadline - Date.now(), before.at(-1) ? String(before.at(-1)!.seq) : undefined);
        } catch {
          // A stream refused or cut while the cluster settles (an earlier test moved the event hub,
          // or this one kills a master): opened again after the last event it delivered.
          await new Promise((r) => setTimeout(r, 200));
        }
      }
      return seen;
    })();
    // Awaited below; a test that fails before must not leave it unhandled.
    stream.catch(() => undefined);
    await onA.post(`/v1/sessions/${id}/events`, msg('go'));
    await waitFor('the tool call', () => (seen.some((e) => e.type === 'agent.tool_use') ? true : undefined), 60_000).catch(async (err: unknown) => {
      // Whether the turn stalled or only the stream did: the log as a plain read sees it, and where the turn stands.
      const logged = await redis.xrange(eventLogKeys.stream(id), '-', '+').then(
        (entries) => entries.map(([, fields]) => /"type":"([^"]+)"/.exec(fields.join(' '))?.[1] ?? '?').join(', '), (e: unknown) => `(${String(e)})`);
      throw new Error(`${(err as Error).message}; the stream showed ${seen.map((e) => e.type).join(', ') || 'nothing'}; the log holds ${logged}; ${await stuckTurn(id)}`);
    });
    const beforeKill = [...seen];
    const killedAt = Date.now();
    await cluster.kill(master);
    await waitFor('the replica promoted', async () => ((await cluster.masterOf(eventLogKeys.stream(id)).catch(() => 0)) === replica ? true : undefined), 30_000);
    const failoverMs = Date.now() - killedAt;
    process.stdout.write(`cluster: replica promoted ${failoverMs} ms after kill -9 of the Session's master\n`);
    // The promoted master has no replica yet, so appends (which wait for one) are refused until
    // the old master is back as its replica: a supervisor restarts it, as here.
    await cluster.restart(master);
    const all = await stream;
    const idle = all.find((e) => e.type === 'session.status_idle');
    expect(idle, `no end of turn ${Date.now() - killedAt} ms after the kill; the stream showed ${all.map((e) => e.type).join(', ')}; ${idle ? '' : await stuckTurn(id)}`).toBeDefined();
    expect(idle?.payload.stop_reason).toMatchObject({ type: 'end_turn' });
    // Read back from the promoted master: every event a reader saw before the kill is still
    // there, same id and seq; the sequence has no holes.
    const thread = (await onB.get<{ data: { id: string }[] }>(`/v1/sessions/${id}/threads`)).data[0]!.id;
    const log = (await onB.get<{ data: TurnEvent[] }>(`/v1/sessions/${id}/threads/${thread}/events`, { limit: 1000 })).data;
    const byId = new Map(log.map((e) => [e.id, e.seq]));
    for (const e of beforeKill) expect(byId.get(e.id)).toBe(e.seq);
    const seqs = log.map((e) => e.seq);
    expect(new Set(seqs).size).toBe(seqs.length);
    expect(failoverMs).toBeLessThan(30_000);
  }, 180_000);

  it('measures what asynchronous replication loses on a master failure, and that WAIT refuses to acknowledge what a replica lacks', async () => {
    await cluster.waitHealthy(60_000);
    // A Session tag whose master still has a replica.
    let sessionId = '';
    let master = 0;
    let replica: number | undefined;
    for (let i = 0; i < 200 && replica === undefined; i++) {
      sessionId = `sess_measure${i}`;
      master = await cluster.masterOf(eventLogKeys.stream(sessionId));
      replica = await cluster.replicaOf(master);
    }
    expect(replica).toBeDefined();
    const fast = new EventLog(redis);
    const durable = new EventLog(redis, { waitReplicas: 1, waitTimeoutMs: 300 });
    const ev = (n: number) => ({ type: 'agent.message', payload: { n }, session_thread_id: null });
    expect((await durable.append(sessionId, [ev(1)])).ok).toBe(true);
    // Cut the replica off: stop its process and drop its link, so nothing more reaches it.
    cluster.pause(replica!, true);
    try {
      await cluster.node(master).call('CLIENT', 'KILL', 'TYPE', 'replica');
      let acknowledged = 0;
      for (let n = 2; n <= 6; n++) if ((await fast.append(sessionId, [ev(n)])).ok) acknowledged++;
      expect(acknowledged).toBe(5);
      await expect(durable.append(sessionId, [ev(7)])).rejects.toBeInstanceOf(AppendNotReplicatedError);
      await cluster.kill(master);
    } finally {
      cluster.pause(replica!, false);
    }
    await waitFor('the replica promoted', async () => ((await cluster.masterOf(eventLogKeys.stream(sessionId)).catch(() => 0)) === replica ? true : undefined), 30_000);
    const after = await waitFor('the log readable', () => fast.range(sessionId, 0, 100).catch(() => undefined), 20_000);
    // Without WAIT: the five acknowledged appends made while the replica lagged are gone. With
    // WAIT: the first append survived; the last was never acknowledged.
    expect(after.map((e) => (e.payload as { n: number }).n)).toEqual([1]);
  }, 90_000);
});

export type { TurnEvent };
