import { request as httpRequest, type IncomingMessage } from 'node:http';
import { request as httpsRequest } from 'node:https';
import type { LookupFunction } from 'node:net';
import { ApiError, canonicalJson, crashPoint, newId, nowIso, sha256Hex, staleOrAhead } from '@agentplane/core';
import { tags, type DocumentStore, type KeyedWrite, type KeyedWrites, type ListPage, type StoredDoc } from '@agentplane/store';
import { checkEndpointUrl, resolveAllowed, type EgressPolicy } from '@agentplane/core';
import { CardRejected, verifyCard, type CardSkillTool, type Discovery, type VerificationKey } from './card.js';

/**
 * A reviewed provider package: the immutable, versioned record an administrator publishes after
 * reviewing a peer. It names the egress ceiling of every tool source that uses it: exactly one
 * credential-free GET of the card URL and one JSON-RPC POST, both on one origin. A package is
 * never edited; a new review is a new package version (docs/A2A_TOOLS.md).
 */
export interface ProviderPackageDoc extends StoredDoc {
  type: 'provider_package';
  workspace_id: string;
  name: string;
  package_version: number;
  origin: string;
  egress: [{ method: 'GET'; url: string }, { method: 'POST'; url: string }];
  /** Digest of the reviewed content (name, version, egress): the package's identity. */
  digest: string;
  reviewed_by: string;
  review_note: string | null;
}

export interface ToolSourceDoc extends StoredDoc {
  type: 'tool_source';
  workspace_id: string;
  name: string;
  /** The provider package name; `provider_package` pins the exact reviewed version. */
  provider: string;
  provider_package: { id: string; package_version: number; digest: string };
  source: { kind: 'a2a'; card_url: string; verification_keys: VerificationKey[] };
  /** Source revision: 1 at creation, +1 per published rotation. */
  revision: number;
  sync: { state: 'pending' | 'synced' | 'rejected'; checked_at: string | null; rejection: { reason: string; detail: string } | null };
  discovery: Omit<Discovery, 'tools'> | null;
  tools: CardSkillTool[];
  /**
   * The migration of dependent Connections to the latest published revision (null before the
   * first rotation). `running` until every dependent Connection pins `revision`.
   */
  migration?: { revision: number; state: 'running' | 'completed'; started_at: string; completed_at: string | null } | null;
}

/**
 * A Connection of kind `a2a_tool_source`: a Workspace's use of a tool source, pinned to the
 * source revision (and package identity) it was made or last migrated under. Rotation names
 * these as the source's dependents and migrates them (docs/A2A_TOOLS.md, "Tool source Connections").
 */
export interface ToolSourceConnectionDoc extends StoredDoc {
  type: 'connection';
  workspace_id: string;
  name: string;
  kind: 'a2a_tool_source';
  tool_source_id: string;
  source_revision: number;
  provider_package: { id: string; package_version: number; digest: string };
  status: 'active';
  archived_at: null;
}

/** What runs a published rotation's migration: durable and resumable (a BullMQ job, `migrations.ts`). */
export interface MigrationQueue {
  /** Records the intent (before the publish) so a crash between publish and enqueue is recovered. */
  intend(ws: string, sourceId: string, revision: number): Promise<void>;
  enqueue(ws: string, sourceId: string, revision: number): Promise<void>;
}

const PKG_INDEX = 'provider_packages';
const SRC_INDEX = 'tool_sources';
/** The Connections that depend on one tool source. */
const connIndex = (sourceId: string) => `tool_source_connections:${sourceId}`;
const CARD_MAX_BYTES = 1 << 20;

/** A package's id is derived from (Workspace, name, version): the same version can exist once. */
const packageId = (ws: string, name: string, v: number) => `ppkg_${sha256Hex(`${ws}\n${name}\n${v}`).slice(0, 32)}`;

export interface PackageInput {
  name: string;
  package_version: number;
  card_url: string;
  rpc_url: string;
  review_note?: string | undefined;
}

export interface SourceInput {
  name: string;
  provider: string;
  provider_package_version?: number | undefined;
  source: { kind: 'a2a'; card_url: string; verification_keys: VerificationKey[] };
}

export interface RotationInput {
  expected_version?: number | undefined;
  source: SourceInput['source'];
  provider_package: { id: string; package_version: number; digest: string };
  dependent_connections: { id: string; version: number }[];
}

export interface ToolSourceSettings {
  egress: EgressPolicy;
  cardTimeoutMs: number;
}

export class ToolSourceService {
  private migrations: MigrationQueue | undefined;
  /** Keyed rotations, each with the source revision it published (`rotate`). */
  private readonly rotations: KeyedWrites;

  constructor(private readonly docs: DocumentStore, private readonly settings: ToolSourceSettings) {
    this.rotations = docs.keyedWrites('tsrc_rot_req');
  }

  useMigrations(queue: MigrationQueue): void {
    this.migrations = queue;
  }

  // --- provider packages -------------------------------------------------------------------

  async publishPackage(ws: string, reviewer: string, input: PackageInput): Promise<ProviderPackageDoc> {
    const card = checkEndpointUrl(input.card_url, this.settings.egress, 'body.card_url');
    const rpc = checkEndpointUrl(input.rpc_url, this.settings.egress, 'body.rpc_url');
    if (card.origin !== rpc.origin) throw new ApiError('validation.malformed', 'body.rpc_url: the card GET and the JSON-RPC POST must be on one origin');
    if (card.search || rpc.search) throw new ApiError('validation.malformed', 'body: egress URLs take no query string');
    const existing = await this.packagesNamed(ws, input.name);
    const highest = existing.reduce((m, p) => Math.max(m, p.package_version), 0);
    if (input.package_version <= highest) {
      throw new ApiError('validation.conflict', `provider package ${input.name} is already at version ${highest}; a new review must be a higher version`);
    }
    const egress: ProviderPackageDoc['egress'] = [{ method: 'GET', url: card.href }, { method: 'POST', url: rpc.href }];
    const now = nowIso();
    const doc: ProviderPackageDoc = {
      id: packageId(ws, input.name, input.package_version), type: 'provider_package', workspace_id: ws, name: input.name,
      package_version: input.package_version, origin: card.origin, egress,
      digest: `sha256:${sha256Hex(canonicalJson({ name: input.name, package_version: input.package_version, egress }))}`,
      reviewed_by: reviewer, review_note: input.review_note ?? null, version: 1, created_at: now, updated_at: now,
    };
    if (!(await this.docs.create(tags.workspace(ws), doc, [PKG_INDEX]))) {
      throw new ApiError('validation.conflict', `provider package ${input.name} version ${input.package_version} already exists`);
    }
    return doc;
  }

  async getPackage(ws: string, id: string): Promise<ProviderPackageDoc> {
    const doc = await this.docs.get<ProviderPackageDoc>(tags.workspace(ws), id);
    if (!doc || doc.type !== 'provider_package' || doc.workspace_id !== ws) throw new ApiError('validation.not_found', `provider package ${id} not found`);
    return doc;
  }

  listPackages(ws: string, options: { limit: number; page?: string | undefined }): Promise<ListPage<ProviderPackageDoc>> {
    return this.docs.list<ProviderPackageDoc>(tags.workspace(ws), PKG_INDEX, { ...options, order: 'asc' });
  }

  private async packagesNamed(ws: string, name: string): Promise<ProviderPackageDoc[]> {
    const out: ProviderPackageDoc[] = [];
    let page: string | undefined;
    do {
      const p = await this.docs.list<ProviderPackageDoc>(tags.workspace(ws), PKG_INDEX, { limit: 100, page, order: 'asc' }, (d) => d.name === name);
      out.push(...p.data);
      page = p.next_page ?? undefined;
    } while (page);
    return out;
  }

  /** The exact package, or the highest version of that name. */
  async resolvePackage(ws: string, name: string, version?: number): Promise<ProviderPackageDoc> {
    if (version !== undefined) {
      const doc = await this.docs.get<ProviderPackageDoc>(tags.workspace(ws), packageId(ws, name, version));
      if (!doc || doc.type !== 'provider_package') throw new ApiError('validation.not_found', `provider package ${name} version ${version} not found`);
      return doc;
    }
    const all = await this.packagesNamed(ws, name);
    const best = all.sort((a, b) => b.package_version - a.package_version)[0];
    if (!best) throw new ApiError('validation.not_found', `no reviewed provider package named ${name}; publish one before adding its tool source`);
    return best;
  }

  // --- tool sources ------------------------------------------------------------------------

  async createSource(ws: string, input: SourceInput, id = newId('toolSource')): Promise<ToolSourceDoc> {
    const pkg = await this.resolvePackage(ws, input.provider, input.provider_package_version);
    checkSourceAgainstPackage(input.source, pkg, 'body.source');
    const now = nowIso();
    const doc: ToolSourceDoc = {
      id, type: 'tool_source', workspace_id: ws, name: input.name, provider: pkg.name,
      provider_package: { id: pkg.id, package_version: pkg.package_version, digest: pkg.digest },
      source: { kind: 'a2a', card_url: input.source.card_url, verification_keys: input.source.verification_keys.map(publicKey) },
      revision: 1, sync: { state: 'pending', checked_at: null, rejection: null }, discovery: null, tools: [], migration: null,
      version: 1, created_at: now, updated_at: now,
    };
    await this.docs.create(tags.workspace(ws), doc, [SRC_INDEX]);
    return doc;
  }

  /** The tool source stored under `id` in the Workspace; null when there is none. */
  findSource(ws: string, id: string): Promise<ToolSourceDoc | null> {
    return this.docs.get<ToolSourceDoc>(tags.workspace(ws), id);
  }

  async getSource(ws: string, id: string): Promise<ToolSourceDoc> {
    const doc = await this.findSource(ws, id);
    if (!doc || doc.type !== 'tool_source' || doc.workspace_id !== ws) throw new ApiError('validation.not_found', `tool source ${id} not found`);
    return doc;
  }

  listSources(ws: string, options: { limit: number; page?: string | undefined }): Promise<ListPage<ToolSourceDoc>> {
    return this.docs.list<ToolSourceDoc>(tags.workspace(ws), SRC_INDEX, { ...options, order: 'asc' });
  }

  /**
   * Fetches the card (the package's credential-free GET, nothing else), verifies it and records
   * the outcome. A rejected card leaves the previous discovery and tools untouched and answers
   * 409 `validation.conflict` naming the reason.
   */
  async sync(ws: string, id: string): Promise<ToolSourceDoc> {
    const src = await this.getSource(ws, id);
    const pkg = await this.getPackage(ws, src.provider_package.id);
    const outcome = await this.discover(src.name, src.source, pkg);
    const checked = nowIso();
    const next = await this.docs.update<ToolSourceDoc>(tags.workspace(ws), id, (cur) => {
      if (cur.revision !== src.revision) return null;
      if ('rejected' in outcome) return { ...cur, sync: { state: 'rejected', checked_at: checked, rejection: outcome.rejected } };
      const { tools, ...discovery } = outcome.discovery;
      return { ...cur, sync: { state: 'synced', checked_at: checked, rejection: null }, discovery, tools };
    });
    if ('rejected' in outcome) throw new ApiError('validation.conflict', `the agent card was rejected (${outcome.rejected.reason}): ${outcome.rejected.detail}`);
    return next;
  }

  /**
   * Rotates trust (`POST /v1/tool-sources/{id}/source-revisions`): a candidate source under an
   * exact, strictly higher and compatible package. The caller states the complete sorted list of
   * dependent Connections with their versions; a list that is not exactly the current one is
   * refused. Discovery (the credential-free card GET, nothing else) must verify before the
   * revision is published; the publish is fenced on the source's version.
   *
   * `keyed` (the route requires a key): the revision is recorded for the request in the publish's
   * own script. The retry of a rotation whose first attempt died after publishing (its key's
   * pending record lapsed), which would now be refused (its package no longer higher, its
   * dependents' versions moved by the migration), is answered the source while that revision is
   * still its current one; one rotated again since is no longer what that attempt answered: 409
   * `idempotency.conflict`, nothing written.
   */
  async rotate(ws: string, id: string, input: RotationInput, keyed?: KeyedWrite): Promise<ToolSourceDoc> {
    const tag = tags.workspace(ws);
    const [src, earlier] = await Promise.all([this.getSource(ws, id), keyed ? this.rotations.find(tag, keyed) : null]);
    if (earlier !== null) {
      if (src.revision !== Number(earlier)) {
        throw new ApiError('idempotency.conflict', `this Idempotency-Key published source revision ${earlier}, and the tool source has had revision ${src.revision} since; use a new key`);
      }
      return src;
    }
    if (input.expected_version !== undefined && input.expected_version !== src.version) {
      throw new ApiError('validation.conflict', `version ${input.expected_version} ${staleOrAhead(input.expected_version, src.version)}; the current version is ${src.version}`);
    }
    const pkg = await this.getPackage(ws, input.provider_package.id);
    if (pkg.package_version !== input.provider_package.package_version || pkg.digest !== input.provider_package.digest) {
      throw new ApiError('validation.conflict', `body.provider_package: ${pkg.id} is ${pkg.name} v${pkg.package_version} (${pkg.digest}), not the identity given`);
    }
    const current = await this.getPackage(ws, src.provider_package.id);
    if (pkg.name !== current.name || pkg.origin !== current.origin) {
      throw new ApiError('validation.conflict', `body.provider_package: ${pkg.name} v${pkg.package_version} is not compatible with ${current.name} (same package name and origin required)`);
    }
    if (pkg.package_version <= current.package_version) {
      throw new ApiError('validation.conflict', `body.provider_package: version ${pkg.package_version} is not higher than the current ${current.package_version}`);
    }
    checkSourceAgainstPackage(input.source, pkg, 'body.source');
    const sorted = [...input.dependent_connections].sort((a, b) => (a.id < b.id ? -1 : a.id > b.id ? 1 : 0));
    if (sorted.some((d, i) => d.id !== input.dependent_connections[i]!.id) || new Set(sorted.map((d) => d.id)).size !== sorted.length) {
      throw new ApiError('validation.malformed', 'body.dependent_connections: must be sorted by id, without repeats');
    }
    const actual = await this.dependents(ws, id);
    const same = actual.length === sorted.length && actual.every((d, i) => d.id === sorted[i]!.id && d.version === sorted[i]!.version);
    if (!same) {
      throw new ApiError('validation.conflict', `body.dependent_connections: stale; the dependent Connections are ${JSON.stringify(actual)}`);
    }
    const outcome = await this.discover(src.name, input.source, pkg);
    if ('rejected' in outcome) throw new ApiError('validation.conflict', `the candidate's agent card was rejected (${outcome.rejected.reason}): ${outcome.rejected.detail}`);
    const { tools, ...discovery } = outcome.discovery;
    const checked = nowIso();
    const revision = src.revision + 1;
    // The intent first: a crash after the publish and before the enqueue is found by the sweep.
    if (actual.length > 0) await this.migrations?.intend(ws, id, revision);
    const published = await this.docs.update<ToolSourceDoc>(tags.workspace(ws), id, (cur) => ({
      ...cur,
      provider_package: { id: pkg.id, package_version: pkg.package_version, digest: pkg.digest },
      source: { kind: 'a2a', card_url: input.source.card_url, verification_keys: input.source.verification_keys.map(publicKey) },
      revision,
      sync: { state: 'synced', checked_at: checked, rejection: null },
      discovery, tools,
      migration: { revision, state: actual.length > 0 ? 'running' : 'completed', started_at: checked, completed_at: actual.length > 0 ? null : checked },
    }), {
      expectedVersion: src.version,
      ...(keyed ? { write: (next: ToolSourceDoc, expected: number) => this.docs.swapRecorded(tag, id, next, expected, this.rotations, keyed, String(revision)) } : {}),
    });
    crashPoint('tool-source-rotated');
    if (actual.length > 0) await this.migrations?.enqueue(ws, id, revision);
    return published;
  }

  // --- Connections of kind a2a_tool_source ---------------------------------------------------

  /** A Connection using the source, pinned to its current (synced) revision. */
  async createConnection(ws: string, sourceId: string, input: { name: string }, id = newId('connection')): Promise<ToolSourceConnectionDoc> {
    const src = await this.getSource(ws, sourceId);
    if (!src.discovery) throw new ApiError('validation.conflict', `tool source ${sourceId} is not synced; sync it before connecting it`);
    const now = nowIso();
    const doc: ToolSourceConnectionDoc = {
      id, type: 'connection', workspace_id: ws, name: input.name, kind: 'a2a_tool_source', tool_source_id: sourceId,
      source_revision: src.revision, provider_package: src.provider_package, status: 'active', archived_at: null,
      version: 1, created_at: now, updated_at: now,
    };
    await this.docs.create(tags.workspace(ws), doc, [connIndex(sourceId)]);
    return doc;
  }

  /** The Connection of tool source `sourceId` stored under `id` in the Workspace; null when there is none. */
  async findConnection(ws: string, sourceId: string, id: string): Promise<ToolSourceConnectionDoc | null> {
    const d = await this.docs.get<ToolSourceConnectionDoc>(tags.workspace(ws), id);
    return d && d.type === 'connection' && d.kind === 'a2a_tool_source' && d.tool_source_id === sourceId ? d : null;
  }

  listConnections(ws: string, sourceId: string, options: { limit: number; page?: string | undefined }): Promise<ListPage<ToolSourceConnectionDoc>> {
    return this.docs.list<ToolSourceConnectionDoc>(tags.workspace(ws), connIndex(sourceId), { ...options, order: 'asc' });
  }

  private async allConnections(ws: string, sourceId: string): Promise<ToolSourceConnectionDoc[]> {
    const out: ToolSourceConnectionDoc[] = [];
    let page: string | undefined;
    do {
      const p = await this.listConnections(ws, sourceId, { limit: 100, page });
      out.push(...p.data);
      page = p.next_page ?? undefined;
    } while (page);
    return out;
  }

  /**
   * One migration run (a durable job's body; safe to run again after a crash at any point):
   * each dependent Connection still pinned below `revision` moves to it by its own
   * compare-and-swap (a lost race re-reads and re-checks, so a Connection is migrated once);
   * then the source's migration is marked completed. A run for a revision that is no longer the
   * latest stops (the newer rotation's job migrates to the newer one). `afterStep` is the
   * test-only fault hook.
   */
  async runMigration(ws: string, sourceId: string, revision: number, afterStep?: () => Promise<void>): Promise<'completed' | 'superseded' | 'unpublished'> {
    const src = await this.getSource(ws, sourceId);
    if (src.revision < revision) return 'unpublished';
    if (src.revision > revision) return 'superseded';
    const tag = tags.workspace(ws);
    for (const conn of await this.allConnections(ws, sourceId)) {
      if (conn.source_revision >= revision) continue;
      await this.docs.update<ToolSourceConnectionDoc>(tag, conn.id, (cur) => (cur.source_revision >= revision ? null : {
        ...cur, source_revision: revision, provider_package: src.provider_package,
      }), { current: conn, notFound: 'connection' });
      await afterStep?.();
    }
    const done = nowIso();
    await this.docs.update<ToolSourceDoc>(tag, sourceId, (cur) => (cur.migration?.revision === revision && cur.migration.state === 'running'
      ? { ...cur, migration: { ...cur.migration, state: 'completed', completed_at: done } }
      : null));
    return 'completed';
  }

  /** The Connections (kind `a2a_tool_source`) that depend on a tool source, with their versions, sorted by id. */
  async dependents(ws: string, id: string): Promise<{ id: string; version: number }[]> {
    return (await this.allConnections(ws, id)).map((c) => ({ id: c.id, version: c.version })).sort((a, b) => (a.id < b.id ? -1 : a.id > b.id ? 1 : 0));
  }

  /** The card GET and its verification; never sends a credential. */
  async discover(name: string, source: ToolSourceDoc['source'], pkg: ProviderPackageDoc): Promise<{ discovery: Discovery } | { rejected: { reason: string; detail: string } }> {
    let raw: unknown;
    try {
      raw = await this.fetchCard(source.card_url);
    } catch (e) {
      return { rejected: { reason: 'card_unreachable', detail: (e as Error).message } };
    }
    try {
      return { discovery: await verifyCard(raw, { keys: source.verification_keys, rpcUrl: pkg.egress[1].url, sourceName: name }) };
    } catch (e) {
      if (e instanceof CardRejected) return { rejected: { reason: e.reason, detail: e.detail } };
      throw e;
    }
  }

  /**
   * The credential-free card GET: the host is checked by the outbound address guard and the
   * connection goes to the very address that was checked (no DNS rebinding); no redirect is
   * followed; at most 1 MiB.
   */
  private async fetchCard(cardUrl: string): Promise<unknown> {
    const url = checkEndpointUrl(cardUrl, this.settings.egress);
    const target = await resolveAllowed(url.hostname, this.settings.egress);
    const lookup: LookupFunction = (_host, opts, cb) => {
      if ((opts as { all?: boolean }).all) (cb as unknown as (e: null, a: { address: string; family: number }[]) => void)(null, [target]);
      else cb(null, target.address, target.family);
    };
    const body = await new Promise<Buffer>((resolve, reject) => {
      const req = (url.protocol === 'https:' ? httpsRequest : httpRequest)(url, {
        method: 'GET', lookup, timeout: this.settings.cardTimeoutMs, headers: { accept: 'application/json', 'user-agent': 'agentplane-tool-sources/1' },
      }, (res: IncomingMessage) => {
        if (res.statusCode !== 200) {
          res.resume();
          reject(new Error(`the card GET answered ${res.statusCode ?? 0}`));
          return;
        }
        const chunks: Buffer[] = [];
        let size = 0;
        res.on('data', (c: Buffer) => {
          size += c.length;
          if (size > CARD_MAX_BYTES) {
            req.destroy();
            reject(new Error('the card is larger than 1 MiB'));
            return;
          }
          chunks.push(c);
        });
        res.on('end', () => resolve(Buffer.concat(chunks)));
        res.on('error', reject);
      });
      req.on('timeout', () => req.destroy(new Error('the card GET timed out')));
      req.on('error', reject);
      req.end();
    });
    try {
      return JSON.parse(new TextDecoder('utf-8', { fatal: true }).decode(body)) as unknown;
    } catch {
      throw new Error('the card is not UTF-8 JSON');
    }
  }
}

/** Only the public members of a verification key are kept. */
function publicKey(k: VerificationKey): VerificationKey {
  return { kty: k.kty, crv: k.crv, x: k.x, y: k.y, kid: k.kid, alg: k.alg };
}

/** A source may only use the card GET its package admits. */
export function checkSourceAgainstPackage(source: SourceInput['source'], pkg: ProviderPackageDoc, at: string): void {
  let href: string;
  try {
    href = new URL(source.card_url).href;
  } catch {
    throw new ApiError('validation.malformed', `${at}.card_url: not a URL`);
  }
  if (href !== pkg.egress[0].url) {
    throw new ApiError('validation.malformed', `${at}.card_url: the provider package ${pkg.name} v${pkg.package_version} admits only the card GET ${pkg.egress[0].url}`);
  }
  const kids = source.verification_keys.map((k) => k.kid);
  if (new Set(kids).size !== kids.length) throw new ApiError('validation.malformed', `${at}.verification_keys: kid values must be unique`);
}
