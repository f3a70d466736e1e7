/**
 * The Redis key layout. Every key that a multi-key command or Lua script touches together
 * shares one hash tag, so the layout works unchanged on Redis Cluster:
 *
 *   {o:<org_id>}    an Organization's documents and indexes (API keys, workspaces list)
 *   {w:<wrkspc_id>} a Workspace's documents, indexes, idempotency records
 *   {s:<sess_id>}   one Session: its document, threads, runs, event log, producer keys
 *   {a:<digest>}    one bearer digest -> the credential it authenticates
 *   {r:<id>}        per-key rate-limit windows
 *   {f:<file_id>}   one uploaded File's content (chunks)
 *   {m:<memstore_id>} one MemoryStore's documents, version history and change log
 *   {p:<project_id>} one uploaded Project's revisions and file contents
 *   {k:<skill_id>}  one Skill's immutable versions and their files
 *
 * docs/ARCHITECTURE.md lists every key with its type and owner.
 */
export const KEY_PREFIX = 'ap';

export type Tag = `o:${string}` | `w:${string}` | `s:${string}` | `a:${string}` | `r:${string}` | `g:${string}` | `f:${string}` | `m:${string}` | `p:${string}` | `k:${string}`;

export const tags = {
  org: (orgId: string): Tag => `o:${orgId}`,
  workspace: (workspaceId: string): Tag => `w:${workspaceId}`,
  session: (sessionId: string): Tag => `s:${sessionId}`,
  auth: (digest: string): Tag => `a:${digest}`,
  rate: (id: string): Tag => `r:${id}`,
  global: (name: string): Tag => `g:${name}`,
  file: (fileId: string): Tag => `f:${fileId}`,
  memoryStore: (storeId: string): Tag => `m:${storeId}`,
  project: (projectId: string): Tag => `p:${projectId}`,
  skill: (skillId: string): Tag => `k:${skillId}`,
};

export const keys = {
  /** JSON document of one resource. */
  doc: (tag: Tag, id: string) => `${KEY_PREFIX}:{${tag}}:doc:${id}`,
  /** Sorted set (score = created ms) listing a collection inside one tag. */
  index: (tag: Tag, collection: string) => `${KEY_PREFIX}:{${tag}}:idx:${collection}`,
  /** Unique-name claims inside one tag (hash name -> id). */
  unique: (tag: Tag, collection: string) => `${KEY_PREFIX}:{${tag}}:uniq:${collection}`,
  /** Bearer digest -> credential record. */
  auth: (digest: string) => `${KEY_PREFIX}:{${tags.auth(digest)}}:cred`,
  /** Fixed-window request counter for one API key and one minute. */
  rate: (keyId: string, window: number) => `${KEY_PREFIX}:{${tags.rate(keyId)}}:rl:${window}`,
  /** Idempotency record of one key in one workspace. */
  idempotency: (workspaceTag: Tag, idemKey: string) => `${KEY_PREFIX}:{${workspaceTag}}:idem:${idemKey}`,
  /** Platform-wide singletons: bootstrap marker, default org. */
  global: (name: string) => `${KEY_PREFIX}:{${tags.global(name)}}:${name}`,
  /** Any other per-tag key; `name` says what it holds. */
  scoped: (tag: Tag, name: string) => `${KEY_PREFIX}:{${tag}}:${name}`,
};
