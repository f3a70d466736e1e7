import { mkdtempSync, rmSync } from 'node:fs';
import { hostname, tmpdir } from 'node:os';
import { join } from 'node:path';
import { randomBytes } from 'node:crypto';
import Docker from 'dockerode';
import { afterAll, describe, expect, it } from 'vitest';
import { createLogger } from '@agentplane/core';
import { saveCredential } from '@agentplane/protocol';
import { planReap, SandboxReaper } from './reaper.js';
import { SANDBOX_LABELS } from './labels.js';

/** Judging other runners' sandboxes, on real Docker volumes of a scope of this test alone. */
const docker = new Docker();
const scope = `${process.env.AGENTPLANE_SANDBOX_SCOPE ?? 'test'}-reaper-unit-${randomBytes(3).toString('hex')}`;
const made: string[] = [];
const dirs: string[] = [];
const ok = await docker.ping().then(() => true, () => false);

async function volume(runner: string, labels: Record<string, string>, managed = 'true'): Promise<string> {
  const name = `agentplane-test-${scope}-${runner}`;
  await docker.createVolume({ Name: name, Labels: { [SANDBOX_LABELS.managed]: managed, [SANDBOX_LABELS.runner]: runner, [SANDBOX_LABELS.session]: `sess_${runner}`, [SANDBOX_LABELS.scope]: scope, ...labels } });
  made.push(name);
  return name;
}
const exists = (name: string) => docker.getVolume(name).inspect().then(() => true, () => false);

afterAll(async () => {
  for (const v of made) await docker.getVolume(v).remove({ force: true }).catch(() => undefined);
  for (const d of dirs) rmSync(d, { recursive: true, force: true });
});

describe.skipIf(!ok)('sandbox reaper', () => {
  it('reaps only managed items of gone runners of this host, after the grace period', async () => {
    const home = (): string => {
      const d = mkdtempSync(join(tmpdir(), 'reaper-home-'));
      dirs.push(d);
      return d;
    };
    const me = hostname();
    const repaired = home();
    saveCredential(repaired, { base_url: 'http://127.0.0.1:9', secret: 's', runner_id: 'runner_new', runner_credential_id: 'c', runner_pool_id: 'p', workspace_id: 'w', machine_label: 'm', paired_at: '' });
    const unreachable = home();
    saveCredential(unreachable, { base_url: 'http://127.0.0.1:9', secret: 's', runner_id: 'runner_down', runner_credential_id: 'c', runner_pool_id: 'p', workspace_id: 'w', machine_label: 'm', paired_at: '' });

    const gone = await volume('runner_gone', { [SANDBOX_LABELS.home]: join(tmpdir(), `no-such-${scope}`), [SANDBOX_LABELS.host]: me });
    const old = await volume('runner_old', { [SANDBOX_LABELS.home]: repaired, [SANDBOX_LABELS.host]: me });
    const down = await volume('runner_down', { [SANDBOX_LABELS.home]: unreachable, [SANDBOX_LABELS.host]: me });
    const legacy = await volume('runner_legacy', {});
    const elsewhere = await volume('runner_elsewhere', { [SANDBOX_LABELS.home]: join(tmpdir(), `no-such-${scope}`), [SANDBOX_LABELS.host]: `${me}-other` });
    const self = await volume('runner_self', { [SANDBOX_LABELS.home]: join(tmpdir(), `no-such-${scope}`), [SANDBOX_LABELS.host]: me });
    const unmanaged = await volume('runner_unmanaged', { [SANDBOX_LABELS.home]: join(tmpdir(), `no-such-${scope}`), [SANDBOX_LABELS.host]: me }, 'false');

    const plan = await planReap({ docker, scope, selfRunnerId: 'runner_self' });
    const verdicts = Object.fromEntries(plan.runners.map((r) => [r.runner, r.verdict]));
    expect(verdicts).toEqual({
      runner_gone: 'credential_gone', runner_old: 'credential_gone', runner_down: 'unreachable', runner_legacy: 'unattributed',
      runner_elsewhere: 'other_host', runner_self: 'self',
    });
    expect(plan.reapable.map((i) => i.name).sort()).toEqual([gone, old].sort());
    // The default scope sees none of this scope's items.
    expect((await planReap({ docker })).reapable.some((i) => i.name === gone)).toBe(false);

    let now = 1_000_000;
    // Logged as the daemon logs (its logger named, and bound to its own runner).
    const lines: string[] = [];
    const logger = createLogger({ name: 'runner', level: 'info', destination: { write: (line: string) => void lines.push(line) } }).child({ runner: 'runner_self' });
    const reaper = new SandboxReaper({ docker, scope, selfRunnerId: 'runner_self', graceMs: 5000, intervalMs: 0, logger, now: () => now });
    expect((await reaper.pass()).reaped).toEqual([]); // first seen: the grace period starts
    now += 4999;
    expect((await reaper.pass()).reaped).toEqual([]);
    now += 1;
    expect((await reaper.pass()).reaped.map((i) => i.name).sort()).toEqual([gone, old].sort());
    expect(await exists(gone)).toBe(false);
    expect(await exists(old)).toBe(false);
    for (const kept of [down, legacy, elsewhere, self, unmanaged]) expect(await exists(kept), kept).toBe(true);
    // One line per item when its grace period starts and one when it goes, each naming the gone
    // runner and the item under keys of their own: every key once.
    const about = (msg: string) => lines.filter((l) => l.includes(msg)).map((l) => JSON.parse(l) as Record<string, unknown>);
    expect(about('will be reaped after the grace period').map((l) => l.resource).sort()).toEqual([gone, old].sort());
    expect(about('reaped the volume of a gone runner').map((l) => [l.resource, l.gone_runner]).sort()).toEqual([[gone, 'runner_gone'], [old, 'runner_old']].sort());
    for (const l of lines) {
      expect(l.match(/"runner":/g), l).toHaveLength(1);
      expect(l.match(/"name":/g), l).toHaveLength(1);
    }
  }, 60_000);
});
