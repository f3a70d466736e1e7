/**
 * What a Run needs from a runner, derived from its Environment, and the pure matching
 * rules the scheduler applies to a runner's reported capabilities.
 */
export interface ResourceAmounts {
  cpu_millis: number;
  memory_mib: number;
  disk_mib: number;
  max_duration_seconds: number;
}

export interface RunRequirements {
  /** Driver the Environment requires (`docker`, `process`), or any driver when absent. */
  driver?: string | undefined;
  /** Isolation tier required (`container`, `process`); `container` is never served by `process`. */
  tier?: string | undefined;
  platform?: { os?: string | undefined; architecture?: string | undefined } | undefined;
  network_mode: string;
  retention_mode?: string | undefined;
  resources: ResourceAmounts;
  /** An ACP agent harness the runner must have installed (`name`, optionally pinned to a version). */
  acp_harness?: { name: string; version?: string | undefined } | undefined;
  /** The Environment's opt-in browser: only a provider that verified `browser_observation` serves it. */
  browser?: boolean | undefined;
}

/** The part of RunnerPresence.capabilities the matcher reads. */
export interface ProviderCapabilities {
  id?: string;
  drivers: string[];
  tiers: string[];
  platforms?: { os: string; architecture: string }[];
  network_modes: string[];
  retention_modes?: string[];
  maximum_resources?: Partial<ResourceAmounts>;
  /** ACP agent harnesses installed in this provider's sandbox images (and probed). */
  acp_harnesses?: { package: string; version: string }[];
  browser_observation?: { accessibility_tree: boolean; screenshot: boolean };
}

export interface RunnerCapabilities {
  available_slots?: number;
  drivers?: string[];
  /** Protocols beside the runner protocol itself (`model-gateway-v1`, `lease-spec-v1`, …). */
  plane_protocols?: string[];
  providers?: ProviderCapabilities[];
}

export type MatchResult = { ok: true; provider: string | undefined } | { ok: false; reason: string };

const RESOURCE_KEYS: (keyof ResourceAmounts)[] = ['cpu_millis', 'memory_mib', 'disk_mib', 'max_duration_seconds'];

function providerFits(req: RunRequirements, p: ProviderCapabilities): string | null {
  if (req.driver && !p.drivers.includes(req.driver)) return `driver '${req.driver}' not offered (has ${p.drivers.join(', ') || 'none'})`;
  if (req.tier && !p.tiers.includes(req.tier)) return `tier '${req.tier}' not offered (has ${p.tiers.join(', ') || 'none'})`;
  if (!p.network_modes.includes(req.network_mode)) return `network mode '${req.network_mode}' not offered`;
  if (req.browser && !(p.browser_observation?.accessibility_tree && p.browser_observation.screenshot)) return 'browser observation not offered';
  if (req.retention_mode && p.retention_modes && !p.retention_modes.includes(req.retention_mode)) {
    return `retention mode '${req.retention_mode}' not offered`;
  }
  if (req.acp_harness) {
    const want = req.acp_harness;
    const has = p.acp_harnesses ?? [];
    if (!has.some((h) => h.package === want.name && (!want.version || h.version === want.version))) {
      return `ACP harness '${want.name}${want.version ? `@${want.version}` : ''}' not installed (has ${has.map((h) => `${h.package}@${h.version}`).join(', ') || 'none'})`;
    }
  }
  const os = req.platform?.os;
  const arch = req.platform?.architecture;
  if ((os || arch) && p.platforms && !p.platforms.some((pl) => (!os || pl.os === os) && (!arch || pl.architecture === arch))) {
    return `platform ${os ?? '*'}/${arch ?? '*'} not offered`;
  }
  for (const k of RESOURCE_KEYS) {
    const max = p.maximum_resources?.[k];
    if (max !== undefined && req.resources[k] > max) return `${k} ${req.resources[k]} exceeds the runner maximum ${max}`;
  }
  return null;
}

/** Could this runner ever serve the Run (ignoring how busy it is right now)? */
export function matchCapabilities(req: RunRequirements, caps: RunnerCapabilities): MatchResult {
  const providers = caps.providers ?? [];
  if (providers.length === 0) return { ok: false, reason: 'the runner reports no execution provider' };
  const reasons: string[] = [];
  for (const p of providers) {
    const why = providerFits(req, p);
    if (why === null) return { ok: true, provider: p.id };
    reasons.push(why);
  }
  return { ok: false, reason: reasons.join('; ') };
}

/** A runner that could serve the Run and has a free slot now. */
export function matchNow(req: RunRequirements, caps: RunnerCapabilities, reservedSlots = 0): MatchResult {
  const m = matchCapabilities(req, caps);
  if (!m.ok) return m;
  const free = (caps.available_slots ?? 0) - reservedSlots;
  if (free <= 0) return { ok: false, reason: 'no free slot' };
  return m;
}
