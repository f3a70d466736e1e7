import { beforeAll, describe, expect, it, vi } from 'vitest';
import { useEmbeddedRedis } from '@agentplane/store/testing';
import { newId } from '@agentplane/core';
import { DocumentStore, tags, type Redis } from '@agentplane/store';
import { ProjectService } from './service.js';

/**
 * A Project deleted while a revision is written, and a revision read while its contents go: the
 * racing orders are made deterministic by running the deletion from inside the writer's calls.
 * Then a creation whose process died before its head, swept on a timer with no later creation,
 * a revision append sent again after its reply was lost, and a keyed create's retry that finishes
 * such a creation under its id, whichever step of a racing sweep it takes the id over before.
 */
const testRedis = useEmbeddedRedis('projects');
let redis: Redis;
let projects: ProjectService;

beforeAll(() => {
  redis = testRedis();
  projects = new ProjectService(redis, new DocumentStore(redis));
});

const file = (path: string, text: string) => ({ path, content_base64: Buffer.from(text).toString('base64') });

async function projectKeys(projectId: string): Promise<string[]> {
  const found: string[] = [];
  let cursor = '0';
  do {
    const [next, batch] = await redis.scan(cursor, 'MATCH', `ap:{p:${projectId}}:*`, 'COUNT', 1000);
    found.push(...batch);
    cursor = next;
  } while (cursor !== '0');
  return found.sort();
}

/**
 * A ProjectService on a connection of its own whose `nth` script call (1 = the first) first runs
 * `before`: the revision's existence check is behind it, that many of its writes are ahead.
 */
function racingService(nth: number, before: () => Promise<void>): ProjectService {
  const conn = testRedis.connect(`racing-${newId('event')}`);
  const evalsha = conn.evalsha.bind(conn) as (...args: unknown[]) => Promise<unknown>;
  let calls = 0;
  (conn as unknown as { evalsha: (...args: unknown[]) => Promise<unknown> }).evalsha = async (...args: unknown[]) => {
    if (++calls === nth) await before();
    return evalsha(...args);
  };
  return new ProjectService(conn, new DocumentStore(conn));
}

describe('deleting a Project while a revision is written', () => {
  const tree = [file('README.md', 'new readme'), file('src/big.txt', 'x'.repeat(100_000)), file('src/other.txt', 'other')];

  it('deleted before the revision\'s first content is written: 404, and no key of the project is left', async () => {
    const ws = newId('workspace');
    const { project } = await projects.create(ws, 'racing', [file('README.md', 'v1')]);
    const racing = racingService(1, () => projects.remove(ws, project.id));
    await expect(racing.addRevision(ws, project.id, tree, undefined)).rejects.toMatchObject({ type: 'validation.not_found', status: 404 });
    expect(await projectKeys(project.id)).toEqual([]);
  });

  it('deleted between the revision\'s contents and its manifest: 404, and no key of the project is left', async () => {
    const ws = newId('workspace');
    const { project } = await projects.create(ws, 'racing-late', [file('README.md', 'v1')]);
    // Scripts 1-3 store the three contents; the 4th appends the manifest.
    const racing = racingService(4, () => projects.remove(ws, project.id));
    await expect(racing.push(ws, project.id, 1, tree)).rejects.toMatchObject({ type: 'validation.not_found' });
    expect(await projectKeys(project.id)).toEqual([]);
  });

  it('a project created before projects carried their marker is given one by its next revision', async () => {
    const ws = newId('workspace');
    const { project } = await projects.create(ws, 'older', [file('a.txt', 'a')]);
    await redis.del(`ap:{p:${project.id}}:alive`);
    expect((await projects.addRevision(ws, project.id, [file('a.txt', 'b')], 1)).revision_number).toBe(2);
    await projects.remove(ws, project.id);
    expect(await projectKeys(project.id)).toEqual([]);
  });
});

describe('reading a revision whose contents are gone', () => {
  it('is 404 validation.not_found (the project is being deleted), not an untyped error', async () => {
    const ws = newId('workspace');
    const { project, revision } = await projects.create(ws, 'reader', [file('a.txt', 'a'), file('b.txt', 'b')]);
    expect((await projects.readFiles(project.id, 1)).map((f) => f.content.toString())).toEqual(['a', 'b']);
    const digest = revision.files[1]?.sha256.slice('sha256:'.length) ?? '';
    await redis.del(`ap:{p:${project.id}}:blob:${digest}`);
    await expect(projects.readFiles(project.id, 1)).rejects.toMatchObject({ type: 'validation.not_found', status: 404 });
  });
});

describe('the periodic sweep of dead Project creations', () => {
  const JOURNAL = 'ap:{g:project_creations}:project_creations';

  /**
   * A creation whose process dies before its head exists (the head's write never returns): its
   * marker, revision and contents are written and it is on record. Its deadline is then moved
   * back, as if its grace had passed.
   */
  async function deadCreation(): Promise<string> {
    const docs = new DocumentStore(redis);
    docs.create = () => new Promise<never>(() => undefined);
    const ws = newId('workspace');
    void new ProjectService(redis, docs).create(ws, 'lost', [file('a.txt', 'a'), file('b.txt', 'x'.repeat(100_000))]);
    const entry = await vi.waitFor(async () => {
      const [found] = (await redis.zrange(JOURNAL, 0, -1)).filter((e) => e.startsWith(`${ws} `));
      expect(found).toBeDefined();
      expect(await projectKeys(found!.split(' ')[1]!)).toHaveLength(5);
      return found!;
    }, { timeout: 5_000, interval: 20 });
    await redis.zadd(JOURNAL, 0, entry);
    return entry.split(' ')[1]!;
  }

  it('clears what a creation whose process died wrote, with no later creation, and stops when told', async () => {
    const sweeping = new ProjectService(redis, new DocumentStore(redis));
    const failures: unknown[] = [];
    sweeping.startSweeping((err) => failures.push(err), 50);
    try {
      const lost = await deadCreation();
      await vi.waitFor(async () => expect(await projectKeys(lost)).toEqual([]), { timeout: 5_000, interval: 20 });
      expect(await redis.zcard(JOURNAL)).toBe(0);
    } finally {
      sweeping.stopSweeping();
    }

    // Stopped: a dead creation past its grace stays until a sweep runs.
    const kept = await deadCreation();
    await new Promise((r) => setTimeout(r, 300));
    expect(await projectKeys(kept)).toHaveLength(5);
    expect(await sweeping.sweep()).toBe(1);
    expect(await projectKeys(kept)).toEqual([]);
    expect(failures).toEqual([]);
  });
});

describe('a revision write sent again after its reply was lost', () => {
  it('is applied once and answered as written, not as a concurrent revision', async () => {
    const ws = newId('workspace');
    const { project } = await projects.create(ws, 'resent', [file('a.txt', 'a')]);
    // Every append of a manifest (the script whose first key is `:revs`) runs twice, the first
    // answer lost: what the client does when the connection drops after Redis ran a command but
    // before its reply arrived.
    const conn = testRedis.connect(`resending-${newId('event')}`);
    const evalsha = conn.evalsha.bind(conn) as (...args: unknown[]) => Promise<unknown>;
    (conn as unknown as { evalsha: (...args: unknown[]) => Promise<unknown> }).evalsha = async (...args: unknown[]) => {
      if (String(args[2]).endsWith(':revs')) await evalsha(...args);
      return evalsha(...args);
    };
    const resending = new ProjectService(conn, new DocumentStore(conn));
    const two = await resending.addRevision(ws, project.id, [file('a.txt', 'b')], 1);
    expect(two.revision_number).toBe(2);
    const three = await resending.push(ws, project.id, 2, [{ path: 'c.txt', content_base64: Buffer.from('c').toString('base64') }]);
    expect(three.revision_number).toBe(3);
    expect(await projects.latestNumber(project.id)).toBe(3);
    expect((await projects.revision(project.id, 3)).files.map((f) => f.path)).toEqual(['a.txt', 'c.txt']);
  });
});

describe('a keyed create\'s retry under the id of a creation whose process died before its head', () => {
  const JOURNAL = 'ap:{g:project_creations}:project_creations';
  const tree = [file('a.txt', 'a'), file('b.txt', 'x'.repeat(100_000))];

  /** A creation under `id` whose process dies before its head (its write never returns), its grace passed. */
  async function deadCreation(ws: string, id: string): Promise<void> {
    const docs = new DocumentStore(redis);
    docs.create = () => new Promise<never>(() => undefined);
    void new ProjectService(redis, docs).create(ws, 'lost', tree, id);
    await vi.waitFor(async () => expect(await projectKeys(id)).toHaveLength(5), { timeout: 5_000, interval: 20 });
    expect(await redis.zadd(JOURNAL, 0, `${ws} ${id}`)).toBe(0);
  }

  async function finished(ws: string, id: string, firstCreatedAt: string): Promise<void> {
    expect((await projects.get(ws, id)).version).toBe(1);
    expect(await projects.latestNumber(id)).toBe(1);
    expect((await projects.revision(id, 1)).created_at).toBe(firstCreatedAt);
    expect((await projects.readFiles(id, 1)).map((f) => f.content.toString())).toEqual(['a', 'x'.repeat(100_000)]);
    expect(await projectKeys(id)).toHaveLength(5);
    expect((await redis.zrange(JOURNAL, 0, -1)).filter((e) => e.startsWith(`${ws} `))).toEqual([]);
  }

  it('finishes it under the same id, keeping its revision 1; a later sweep keeps it', async () => {
    const ws = newId('workspace');
    const id = newId('project');
    await deadCreation(ws, id);
    const first = await projects.revision(id, 1);
    const { project, revision } = await projects.create(ws, 'lost', tree, id);
    expect([project.id, revision.created_at]).toEqual([id, first.created_at]);
    await finished(ws, id, first.created_at);
    expect(await projects.sweep(Date.now() + 3_600_000)).toBe(0);
    await finished(ws, id, first.created_at);
  });

  it('another tree under the id (not the same request) is refused 409, and what this attempt wrote goes', async () => {
    const ws = newId('workspace');
    const id = newId('project');
    await deadCreation(ws, id);
    await expect(projects.create(ws, 'lost', [file('a.txt', 'other')], id)).rejects.toMatchObject({ type: 'idempotency.conflict', status: 409 });
    expect(await projectKeys(id)).toEqual([]);
  });

  /**
   * A sweep that took the dead creation's entry as due, on a connection of its own whose first
   * call matching `at` first lets the retry take the id over (begin the entry again, set its
   * marker) and holds it there until the sweep is done: whichever step of the sweep the retry
   * comes before, the sweep leaves the retry's entry and keys, and the retry finishes the Project.
   */
  it.each([
    { step: 'the marker read', at: (cmd: string, args: unknown[]) => cmd === 'get' && String(args[0]).endsWith(':alive') },
    { step: 'the entry checked again', at: (cmd: string) => cmd === 'zscore' },
    { step: 'the marker claimed', at: (cmd: string, args: unknown[]) => cmd === 'evalsha' && args[1] === 1 && String(args[2]).endsWith(':alive') },
    { step: 'the contents removed', at: (cmd: string, args: unknown[]) => cmd === 'evalsha' && Number(args[1]) > 1 && String(args[2]).endsWith(':alive') },
    { step: 'the manifests removed', at: (cmd: string, args: unknown[]) => cmd === 'evalsha' && String(args[2]).endsWith(':alive') && String(args[3]).endsWith(':revs') },
  ])('a sweep racing the retry, the retry taking the id over before $step: the Project is kept', async ({ at }) => {
    const ws = newId('workspace');
    const id = newId('project');
    await deadCreation(ws, id);
    const first = await projects.revision(id, 1);
    // The retry's first script (its first content, after its entry and marker) waits for the sweep.
    let tookOver!: () => void;
    const takenOver = new Promise<void>((r) => { tookOver = r; });
    let release!: () => void;
    const released = new Promise<void>((r) => { release = r; });
    const retrier = racingService(1, async () => {
      tookOver();
      await released;
    });
    let retrying: Promise<unknown> | undefined;
    const conn = testRedis.connect(`sweeping-${newId('event')}`);
    for (const cmd of ['get', 'zscore', 'evalsha'] as const) {
      const original = (conn[cmd] as (...args: unknown[]) => Promise<unknown>).bind(conn);
      (conn as unknown as Record<string, (...args: unknown[]) => Promise<unknown>>)[cmd] = async (...args: unknown[]) => {
        if (!retrying && at(cmd, args)) {
          retrying = retrier.create(ws, 'lost', tree, id);
          await takenOver;
        }
        return original(...args);
      };
    }
    await new ProjectService(conn, new DocumentStore(conn)).sweep();
    expect(retrying).toBeDefined();
    // The retry's entry stays on record while it runs.
    expect(Number(await redis.zscore(JOURNAL, `${ws} ${id}`))).toBeGreaterThan(Date.now());
    release();
    await retrying;
    await finished(ws, id, first.created_at);
  });
});

describe('a keyed revision\'s later attempts', () => {
  const b64 = (text: string) => Buffer.from(text).toString('base64');
  const record = (id: string, token: string) => `ap:{p:${id}}:rev_req:${token}`;
  const keyed = (token: string, keptMs = 60_000) => ({ token, keptMs });
  /** What a project's keys hold besides the records of keyed requests, which outlive it until they expire. */
  const withoutRecords = async (id: string) => (await projectKeys(id)).filter((k) => !k.includes(':rev_req:'));

  it('are answered the revision its first attempt appended, unchecked against a base it made stale; another token appends its own', async () => {
    const ws = newId('workspace');
    const { project } = await projects.create(ws, 'keyed', [file('a.txt', 'a')]);
    const two = await projects.addRevision(ws, project.id, [file('a.txt', 'b')], undefined, keyed('rev'));
    const again = await projects.addRevision(ws, project.id, [file('a.txt', 'b')], undefined, keyed('rev'));
    const stale = await projects.addRevision(ws, project.id, [file('a.txt', 'b')], 1, keyed('rev'));
    expect([two, stale]).toEqual([again, again]);
    expect([again.revision_number, await projects.latestNumber(project.id), (await projects.get(ws, project.id)).version]).toEqual([2, 2, 2]);

    const push = [{ path: 'c.txt', content_base64: b64('c') }];
    const three = await projects.push(ws, project.id, 2, push, keyed('push'));
    expect(await projects.push(ws, project.id, 2, push, keyed('push'))).toEqual(three);
    // A token is the request's own: another one appends, the same tree or not.
    expect((await projects.addRevision(ws, project.id, [file('a.txt', 'b')], undefined, keyed('other'))).revision_number).toBe(4);
    expect((await projects.addRevision(ws, project.id, [file('a.txt', 'b')], undefined)).revision_number).toBe(5);
    expect([await projects.latestNumber(project.id), (await projects.get(ws, project.id)).version]).toEqual([5, 5]);
    expect(await Promise.all(['rev', 'push', 'other'].map((t) => redis.get(record(project.id, t))))).toEqual(['2', '3', '4']);
    // Each record lasts as long as keys are kept.
    const ttl = await redis.pttl(record(project.id, 'rev'));
    expect(ttl).toBeGreaterThan(50_000);
    expect(ttl).toBeLessThanOrEqual(60_000);

    await projects.remove(ws, project.id);
    expect(await withoutRecords(project.id)).toEqual([]);
    // A record outliving the project answers nothing: the project is gone first.
    await expect(projects.addRevision(ws, project.id, [file('a.txt', 'b')], undefined, keyed('rev'))).rejects.toMatchObject({ type: 'validation.not_found' });
  });

  it('racing it past its lookup: the append finds the token and answers that revision, nothing appended', async () => {
    const ws = newId('workspace');
    const { project } = await projects.create(ws, 'racing-keyed', [file('a.txt', 'a')]);
    let first: unknown;
    // The racing attempt's first script (its content) comes after the other attempt's whole append.
    const racing = racingService(1, async () => {
      first = await projects.addRevision(ws, project.id, [file('a.txt', 'b')], undefined, keyed('same'));
    });
    const answered = await racing.addRevision(ws, project.id, [file('a.txt', 'b')], undefined, keyed('same'));
    expect(answered).toEqual(first);
    expect([answered.revision_number, await projects.latestNumber(project.id), (await projects.get(ws, project.id)).version]).toEqual([2, 2, 2]);
  });

  it('once older than keys are kept append a revision of their own', async () => {
    const ws = newId('workspace');
    const { project } = await projects.create(ws, 'expiring', [file('a.txt', 'a')]);
    expect((await projects.addRevision(ws, project.id, [file('a.txt', 'b')], undefined, keyed('old', 1))).revision_number).toBe(2);
    // Waits on Redis's own expiry of the record, not on a sleep of a guessed length.
    while ((await redis.exists(record(project.id, 'old'))) === 1) await new Promise((r) => setImmediate(r));
    expect((await projects.addRevision(ws, project.id, [file('a.txt', 'b')], undefined, keyed('old', 60_000))).revision_number).toBe(3);
    expect(await redis.get(record(project.id, 'old'))).toBe('3');
  });

  it('a deletion whose process died before its keys went: the sweep clears its keys, an earlier version\'s hash of records too', async () => {
    const ws = newId('workspace');
    const { project } = await projects.create(ws, 'deleted', [file('a.txt', 'a')]);
    await projects.addRevision(ws, project.id, [file('a.txt', 'b')], undefined, keyed('gone'));
    await redis.hset(`ap:{p:${project.id}}:reqs`, 't:older', '2');
    await redis.zadd('ap:{g:project_creations}:project_creations', 0, `${ws} ${project.id}`);
    await new DocumentStore(redis).remove(tags.workspace(ws), project.id, ['projects']);
    expect(await projects.sweep()).toBe(1);
    expect(await withoutRecords(project.id)).toEqual([]);
  });
});
