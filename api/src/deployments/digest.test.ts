import { describe, expect, it } from 'vitest';
import { configurationDigest } from './service.js';
import { deploymentId, revisionId } from './store.js';

describe('deployment identifiers and digests', () => {
  it('the deployment id is deterministic over (Workspace, Agent) and differs when either differs', () => {
    const ws = `wrkspc_${'1'.repeat(32)}`;
    const agent = `agent_${'2'.repeat(32)}`;
    expect(deploymentId(ws, agent)).toBe(deploymentId(ws, agent));
    expect(deploymentId(ws, agent)).toMatch(/^adep_[0-9a-f]{32}$/);
    expect(deploymentId(`wrkspc_${'3'.repeat(32)}`, agent)).not.toBe(deploymentId(ws, agent));
    expect(deploymentId(ws, `agent_${'4'.repeat(32)}`)).not.toBe(deploymentId(ws, agent));
    expect(revisionId(deploymentId(ws, agent), 1)).toMatch(/^adrev_[0-9a-f]{32}$/);
    expect(revisionId(deploymentId(ws, agent), 1)).not.toBe(revisionId(deploymentId(ws, agent), 2));
  });

  it('the configuration digest is over canonical JSON: key order does not matter, values do', () => {
    const a = configurationDigest({ agent_release_number: 1, execution_target: { type: 'managed', harness_topology: 'split' }, skill_selections: [] });
    const b = configurationDigest({ skill_selections: [], execution_target: { harness_topology: 'split', type: 'managed' }, agent_release_number: 1 });
    expect(a).toBe(b);
    expect(a).toMatch(/^sha256:[0-9a-f]{64}$/);
    expect(configurationDigest({ agent_release_number: 1, execution_target: { type: 'managed', harness_topology: 'colocated' }, skill_selections: [] })).not.toBe(a);
  });
});
