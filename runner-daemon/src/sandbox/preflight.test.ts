import { join } from 'node:path';
import { tmpdir } from 'node:os';
import Docker from 'dockerode';
import { describe, expect, it } from 'vitest';
import { sandboxPreflight } from './preflight.js';

describe('sandbox preflight', () => {
  it('proves every default on this machine with a throwaway sandbox', async () => {
    const report = await sandboxPreflight();
    expect(report.checks.map((c) => [c.name, c.ok])).toEqual([
      ['docker reachable', true],
      ['sandbox image', true],
      ['hardened sandbox starts', true],
      ['network isolation', true],
      ['non-root, no capabilities, no-new-privileges', true],
      ['read-only root, writable workspace', true],
      ['bounded cancel', true],
      ['egress allowlist relay', true],
      ['teardown', true],
    ]);
    expect(report.ok).toBe(true);
  });

  it('stops at the first failing prerequisite when Docker is unreachable', async () => {
    const report = await sandboxPreflight({ docker: new Docker({ socketPath: join(tmpdir(), 'no-such-docker.sock') }) });
    expect(report.ok).toBe(false);
    expect(report.checks).toHaveLength(1);
    expect(report.checks[0]).toMatchObject({ name: 'docker reachable', ok: false });
  });
});
