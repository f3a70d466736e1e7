import { chmodSync, mkdtempSync, readFileSync, readdirSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { classify, CliError } from './cli-errors.js';
import { credentialPath, saveCredential } from '@agentplane/protocol';
import { acquireDaemonLock } from './lock.js';
import { redeemOrEnroll, REQUEST_TIMEOUT_MS, type RedeemOptions } from './pair.js';

const dirs: string[] = [];
const tmp = (): string => {
  const d = mkdtempSync(join(tmpdir(), 'runner-pair-'));
  dirs.push(d);
  return d;
};
const servers: Server[] = [];
afterAll(async () => {
  for (const d of dirs) rmSync(d, { recursive: true, force: true });
  for (const s of servers) {
    s.closeAllConnections();
    await new Promise((r) => s.close(r));
  }
});

const ISSUED = { secret: 'ap_runner_s3cret', runner_credential: { id: 'rcred_new', runner_id: 'runner_new', runner_pool_id: 'rpool_1', workspace_id: 'wksp_1' } };

/** A control plane that answers every redeem with a new credential, counting the calls. */
function issuing(): { fetch: typeof fetch; calls: () => number } {
  let calls = 0;
  const f = (async () => {
    calls += 1;
    return new Response(JSON.stringify(ISSUED), { status: 201, headers: { 'content-type': 'application/json' } });
  }) as unknown as typeof fetch;
  return { fetch: f, calls: () => calls };
}

const pairIn = (configDir: string, extra: Partial<RedeemOptions> = {}): Promise<{ human: string; data: Record<string, unknown> }> =>
  redeemOrEnroll({ command: 'pair', url: 'http://127.0.0.1:1', configDir, label: 'box', code: 'AAAA-BBBB', tty: false, ...extra });

async function failure(p: Promise<unknown>): Promise<CliError> {
  try {
    await p;
  } catch (err) {
    return err as CliError;
  }
  throw new Error('expected a failure');
}

/** A server that accepts connections and requests and never answers. */
async function silent(): Promise<string> {
  const s = createServer(() => undefined);
  servers.push(s);
  await new Promise<void>((r) => s.listen(0, '127.0.0.1', r));
  return `http://127.0.0.1:${(s.address() as AddressInfo).port}`;
}

describe('pair before the code is used', () => {
  it('a config dir that cannot be written is a config error before any request: the code is still unused', async () => {
    const file = join(tmp(), 'file');
    writeFileSync(file, 'x');
    const cp = issuing();
    const err = await failure(pairIn(join(file, 'cfg'), { fetch: cp.fetch }));
    expect(cp.calls()).toBe(0);
    expect(classify(err)).toMatchObject({ type: 'config', code: 2 });
    expect(err.message).toContain(`cannot write the credential into ${join(file, 'cfg')}: ENOTDIR`);
    expect(err.message).toContain('the pairing code is still unused');
  });

  it('a config dir that already holds a credential is refused without --force; --force replaces it and names the old one', async () => {
    const dir = tmp();
    saveCredential(dir, { ...ISSUED.runner_credential, base_url: 'http://old', secret: 'old', runner_id: 'runner_old', runner_credential_id: 'rcred_old', machine_label: 'box', paired_at: 'then' });
    const before = readFileSync(credentialPath(dir), 'utf8');
    const cp = issuing();
    const refused = await failure(pairIn(dir, { fetch: cp.fetch }));
    expect(cp.calls()).toBe(0);
    expect(classify(refused)).toMatchObject({ type: 'usage', code: 2 });
    expect(refused.message).toContain('is already paired');
    expect(refused.message).toContain('runner_old (credential rcred_old)');
    expect(refused.message).toContain('--force');
    expect(readFileSync(credentialPath(dir), 'utf8')).toBe(before);

    const forced = await pairIn(dir, { fetch: cp.fetch, force: true });
    expect(cp.calls()).toBe(1);
    expect(forced.data).toMatchObject({ ok: true, runner_id: 'runner_new', replaced: { runner_id: 'runner_old', runner_credential_id: 'rcred_old' } });
    expect(forced.human).toContain('POST /v1/runner-credentials/rcred_old/revoke');
    expect(JSON.parse(readFileSync(credentialPath(dir), 'utf8'))).toMatchObject({ runner_id: 'runner_new', secret: ISSUED.secret });
  });

  it('a daemon running on the config dir is refused, --force or not', async () => {
    const dir = tmp();
    // A live process (the one that runs this test file) holds the daemon lock.
    const lock = acquireDaemonLock(dir, { pid: process.ppid, start: null });
    try {
      const cp = issuing();
      const err = await failure(pairIn(dir, { fetch: cp.fetch, force: true }));
      expect(cp.calls()).toBe(0);
      expect(classify(err)).toMatchObject({ type: 'already_running', code: 3, fields: { pid: process.ppid } });
      expect(err.message).toContain('stop it first');
    } finally {
      lock.release();
    }
  });

  it('makes an existing 0755 config dir 0700', async () => {
    const dir = tmp();
    chmodSync(dir, 0o755);
    await pairIn(dir, { fetch: issuing().fetch });
    expect(statSync(dir).mode & 0o777).toBe(0o700);
    expect(statSync(credentialPath(dir)).mode & 0o777).toBe(0o600);
  });
});

describe('pair: a credential issued but not stored', () => {
  const enospc = (): never => {
    throw Object.assign(new Error('ENOSPC: no space left on device, write'), { code: 'ENOSPC', syscall: 'write' });
  };

  it('names the credential and how to revoke it, as a config error; the secret is not printed off a terminal', async () => {
    const dir = tmp();
    const err = await failure(pairIn(dir, { fetch: issuing().fetch, save: enospc }));
    expect(classify(err)).toMatchObject({ type: 'config', code: 2, fields: { credential_stored: false, runner_credential_id: 'rcred_new', runner_id: 'runner_new' } });
    expect(err.message).toContain('issued runner credential rcred_new');
    expect(err.message).toContain('ENOSPC');
    expect(err.message).toContain('POST /v1/runner-credentials/rcred_new/revoke');
    expect(err.message).not.toContain(ISSUED.secret);
    expect(JSON.stringify(classify(err))).not.toContain(ISSUED.secret);
    expect(readdirSync(dir).filter((n) => !n.startsWith('daemon.lock'))).toEqual([]);
  });

  it('on a terminal, shows the secret once', async () => {
    const err = await failure(pairIn(tmp(), { fetch: issuing().fetch, save: enospc, tty: true }));
    expect(err.message.split(ISSUED.secret)).toHaveLength(2);
    expect(classify(err).fields).toMatchObject({ secret: ISSUED.secret });
  });
});

describe('pair: a control plane that does not answer', () => {
  it('gives up after the timeout with an error naming the URL (default 30 s)', async () => {
    expect(REQUEST_TIMEOUT_MS).toBe(30_000);
    const base = await silent();
    const started = Date.now();
    const err = await failure(pairIn(tmp(), { url: base, timeoutMs: 300 }));
    expect(Date.now() - started).toBeLessThan(20_000);
    expect(classify(err)).toMatchObject({ type: 'network', code: 1 });
    expect(err.message).toContain(`no answer from ${base}/v1/runner-pairings/redeem within 0.3 s`);
  });

  it('a refused connection names the URL', async () => {
    const s = createServer();
    await new Promise<void>((r) => s.listen(0, '127.0.0.1', r));
    const base = `http://127.0.0.1:${(s.address() as AddressInfo).port}/agentplane`;
    await new Promise((r) => s.close(r));
    const err = await failure(redeemOrEnroll({ command: 'enroll', url: base, configDir: tmp(), label: 'box', apiKey: 'k', pool: 'rpool_1', tty: false }));
    expect(classify(err)).toMatchObject({ type: 'network', code: 1 });
    expect(err.message).toContain(`${base}/v1/runner-pools/rpool_1/enrollments refused the connection (ECONNREFUSED)`);
  });
});
