import { describe, expect, it } from 'vitest';
import { matchCapabilities, matchNow, type RunRequirements, type RunnerCapabilities } from './requirements.js';

const req: RunRequirements = {
  tier: 'container',
  network_mode: 'none',
  resources: { cpu_millis: 1000, memory_mib: 512, disk_mib: 1024, max_duration_seconds: 600 },
};
const docker: RunnerCapabilities = {
  available_slots: 2,
  providers: [
    {
      id: 'docker',
      drivers: ['docker'],
      tiers: ['container'],
      network_modes: ['none'],
      platforms: [{ os: 'linux', architecture: 'x64' }],
      maximum_resources: { cpu_millis: 2000, memory_mib: 4096, disk_mib: 10240, max_duration_seconds: 3600 },
    },
  ],
};
const processOnly: RunnerCapabilities = {
  available_slots: 4,
  providers: [{ id: 'process', drivers: ['process'], tiers: ['process'], network_modes: ['host', 'none'] }],
};

describe('matching', () => {
  it('serves a container Run on a docker runner', () => {
    expect(matchCapabilities(req, docker)).toEqual({ ok: true, provider: 'docker' });
  });
  it('never serves a container Run on a process-only runner', () => {
    const m = matchCapabilities(req, processOnly);
    expect(m.ok).toBe(false);
    if (!m.ok) expect(m.reason).toContain("tier 'container'");
  });
  it('serves an ACP Run only on a runner that installed (and probed) that harness', () => {
    const acp = { ...req, acp_harness: { name: '@zed-industries/claude-code-acp' } };
    const m = matchCapabilities(acp, docker);
    expect(m.ok).toBe(false);
    if (!m.ok) expect(m.reason).toContain("ACP harness '@zed-industries/claude-code-acp' not installed (has none)");
    const installed: RunnerCapabilities = {
      ...docker,
      providers: [{ ...docker.providers![0]!, acp_harnesses: [{ package: '@zed-industries/claude-code-acp', version: '0.16.2' }] }],
    };
    expect(matchCapabilities(acp, installed)).toEqual({ ok: true, provider: 'docker' });
    expect(matchCapabilities({ ...req, acp_harness: { name: '@zed-industries/claude-code-acp', version: '0.16.2' } }, installed).ok).toBe(true);
    expect(matchCapabilities({ ...req, acp_harness: { name: '@zed-industries/claude-code-acp', version: '0.17.0' } }, installed).ok).toBe(false);
    // A built-in-loop Run does not care.
    expect(matchCapabilities(req, installed).ok).toBe(true);
  });
  it('refuses resources over the maximum and unknown platforms', () => {
    expect(matchCapabilities({ ...req, resources: { ...req.resources, memory_mib: 8192 } }, docker).ok).toBe(false);
    expect(matchCapabilities({ ...req, platform: { architecture: 'arm64' } }, docker).ok).toBe(false);
    expect(matchCapabilities({ ...req, platform: { os: 'linux' } }, docker).ok).toBe(true);
  });
  it('needs a free slot now', () => {
    expect(matchNow(req, docker, 1).ok).toBe(true);
    expect(matchNow(req, docker, 2)).toEqual({ ok: false, reason: 'no free slot' });
  });
  it('a runner with no provider serves nothing', () => {
    expect(matchCapabilities(req, {}).ok).toBe(false);
  });
  it('a browser Run goes only to a provider that verified both kinds of browser observation', () => {
    const browserReq = { ...req, browser: true };
    const m = matchCapabilities(browserReq, docker);
    expect(m.ok).toBe(false);
    if (!m.ok) expect(m.reason).toContain('browser observation not offered');
    const half = { ...docker, providers: [{ ...docker.providers![0]!, browser_observation: { accessibility_tree: true, screenshot: false } }] };
    expect(matchCapabilities(browserReq, half).ok).toBe(false);
    const full = { ...docker, providers: [{ ...docker.providers![0]!, browser_observation: { accessibility_tree: true, screenshot: true } }] };
    expect(matchCapabilities(browserReq, full)).toEqual({ ok: true, provider: 'docker' });
    expect(matchCapabilities(req, full).ok).toBe(true);
  });
});
