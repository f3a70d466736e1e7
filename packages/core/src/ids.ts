import { randomFillSync } from 'node:crypto';

/** Every resource prefix of the contract (see docs/API.md, "Identifiers"). */
export const ID_PREFIXES = {
  workspace: 'wrkspc',
  organization: 'org',
  agent: 'agent',
  principal: 'prin',
  session: 'sess',
  thread: 'sthr',
  run: 'run',
  event: 'evt',
  approval: 'approval',
  connection: 'conn',
  memoryStore: 'memstore',
  environment: 'env',
  vault: 'vlt',
  skillProposal: 'skp',
  agentDeployment: 'adep',
  agentDeploymentRevision: 'adrev',
  modelRoutingProfile: 'mrp',
  harnessProfile: 'hprof',
  sandboxProfile: 'sprof',
  automationFiring: 'afire',
  webhookEndpoint: 'whe',
  externalInstallation: 'exti',
  agentInstallation: 'aini',
  surfaceScope: 'surf',
  toolUse: 'toolu',
  // Resources the contract names without a prefix; designed here (docs/API.md).
  apiKey: 'key',
  principalCredential: 'pcred',
  runnerPool: 'rpool',
  runner: 'runner',
  runnerPairing: 'rpair',
  runnerCredential: 'rcred',
  modelCredential: 'mcred',
  resource: 'sres',
  file: 'file',
  permissionAssignment: 'perm',
  actionPolicy: 'apol',
  project: 'proj',
  automation: 'auto',
  firingFeedback: 'afbk',
  outcome: 'outc',
  outcomeEvaluation: 'oeval',
  connectedHarness: 'chrn',
  agentDeploymentConnectionBinding: 'adcb',
  skill: 'skill',
  skillSource: 'sksrc',
  providerPackage: 'ppkg',
  toolSource: 'tsrc',
} as const;

export type IdKind = keyof typeof ID_PREFIXES;
export type IdPrefix = (typeof ID_PREFIXES)[IdKind];

/**
 * Random bytes for ids, drawn from the CSPRNG 4 KiB at a time: a call into it per id (and a
 * Buffer each) was a visible share of a busy API's CPU (several ids per appended event).
 */
const ID_POOL = Buffer.allocUnsafe(4096);
let idPoolAt = ID_POOL.length;

/** A new identifier: the prefix, `_`, then 32 lowercase hex characters (128 random bits). */
export function newId(kind: IdKind): string {
  if (idPoolAt + 16 > ID_POOL.length) {
    randomFillSync(ID_POOL);
    idPoolAt = 0;
  }
  const hex = ID_POOL.toString('hex', idPoolAt, idPoolAt + 16);
  idPoolAt += 16;
  return `${ID_PREFIXES[kind]}_${hex}`;
}

/** The JSON-schema pattern that accepts exactly one kind of identifier. */
export function idPattern(kind: IdKind): string {
  return `^${ID_PREFIXES[kind]}_[0-9a-f]{32}$`;
}

const RE_CACHE = new Map<IdKind, RegExp>();
export function isId(kind: IdKind, value: unknown): value is string {
  if (typeof value !== 'string') return false;
  let re = RE_CACHE.get(kind);
  if (!re) {
    re = new RegExp(idPattern(kind));
    RE_CACHE.set(kind, re);
  }
  return re.test(value);
}

/** Logical key pattern (model routing profile key, credential key, skill name). */
export const LOGICAL_KEY_PATTERN = '^[a-z0-9](?:[a-z0-9._-]{0,93})$';
export const CURSOR_PATTERN = '^c1_[0-9a-z]+$';
export const DIGEST_PATTERN = '^sha256:[0-9a-f]{64}$';
