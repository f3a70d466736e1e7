import { ApiError, crashPoint, newId, nowIso, sha256Hex } from '@agentplane/core';
import { keys, LuaScript, tags, type DocumentStore, type ListPage, type Redis } from '@agentplane/store';
import {
  checkSkillFiles, SKILL_INDEX, SkillReader, skillKeys, skillNameKey, type SkillDoc, type SkillFile, type SkillSelection, type SkillVersion,
} from '@agentplane/domain';

/**
 * Appends version `ARGV[1]` of a skill only if it holds exactly `ARGV[1] - 1` versions, with its
 * files. KEYS: versions hash, files key, claims hash. ARGV: n, manifest, files, the content
 * digest, the publish's claim (or an empty string), and the number of versions the latest of
 * which may be reused from (below).
 *
 * A publish is settled here, in the one script that appends, so concurrent or repeated publishes
 * of the same content cannot each append: a claim already taken answers its version; a latest
 * version with the same content digest is reused (and the claim recorded against it) when the
 * skill holds more versions than `ARGV[6]`: 0 for an adoption (any latest version), the head's
 * `latest_version` for any other publish (the latest version only when its head does not show it
 * yet: what a publish cut short between its append and its head left, which the same publish
 * again completes instead of appending a copy). Answers n when version n was appended, -m when
 * version m already holds the content, 0 when another version was appended meanwhile (the caller
 * reads the count again).
 */
const APPEND = new LuaScript('skill_append_version', `
local claim = ARGV[5]
if claim ~= '' then
  local had = redis.call('HGET', KEYS[3], claim)
  if had then return -tonumber(had) end
end
local len = redis.call('HLEN', KEYS[1])
if len > tonumber(ARGV[6]) then
  local latest = cjson.decode(redis.call('HGET', KEYS[1], tostring(len)))
  if latest.content_sha256 == ARGV[4] then
    if claim ~= '' then redis.call('HSET', KEYS[3], claim, len) end
    return -len
  end
end
if len ~= tonumber(ARGV[1]) - 1 then return 0 end
redis.call('SET', KEYS[2], ARGV[3])
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
if claim ~= '' then redis.call('HSET', KEYS[3], claim, ARGV[1]) end
return tonumber(ARGV[1])`);

/** Claims a skill name in the Workspace (KEYS[1] = the names hash): the existing id, or ARGV[2] newly claimed. */
const CLAIM = new LuaScript('skill_claim_name', `
local cur = redis.call('HGET', KEYS[1], ARGV[1])
if cur then return cur end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
return ARGV[2]`);

export type SkillView = SkillDoc & { latest: SkillVersion };

/** A publish that must happen once (docs/SKILLS.md, "Adoption"): `claim` names it, e.g. the adopted skill proposal. */
export interface PublishOnce {
  claim: string;
}

/** Claims of publishes that happen once (claim -> version), in the skill's own slot beside its versions. */
const claimsKey = (skillId: string) => keys.scoped(tags.skill(skillId), 'claims');

/**
 * Skills: a head per name in the Workspace (`{w:<ws>}:doc:<skill_>`, listed in `:idx:skills`,
 * names claimed in `:uniq:skills`) and, under the skill's own tag `{k:<skill>}`, its immutable
 * versions (`:versions`, number → manifest) and each version's files (`:files:<n>`).
 */
export class SkillService {
  readonly reader: SkillReader;

  constructor(private readonly redis: Redis, private readonly docs: DocumentStore) {
    this.reader = new SkillReader(redis, docs);
  }

  /**
   * A new immutable version of the skill named by `SKILL.md`'s front matter: version 1 of a new
   * Skill, or the next version of the Workspace's Skill of that name (an archived one is
   * unarchived by a new version).
   *
   * The version is appended first (one script), then the head moved to it. A process that dies
   * in between leaves a version its head does not show yet: every read of the Skill (`get`) and
   * the next publish bring the head up to it, and the same content published again (a retry)
   * answers that version instead of appending a copy.
   *
   * `once` makes the publish idempotent (an adoption of content seen in a skill source): under
   * its `claim`, at most one version is ever published, and content equal to the latest
   * version's (the same directory digest) publishes nothing. `requestKey` (the request's
   * Idempotency-Key) claims the version for that key and content the same way, so a retry under
   * the key answers the version its first attempt appended, even once the key's stored answer is
   * gone (a process that died before storing it). Both are settled by the script that appends,
   * so any number of concurrent publishes of the same content append one version; `created`
   * says whether this call appended it.
   */
  async publish(
    ws: string, files: readonly SkillFile[], origin: SkillVersion['origin'], field: string, once?: PublishOnce, requestKey?: string,
  ): Promise<{ skill: SkillDoc; version: SkillVersion; created: boolean }> {
    const checked = checkSkillFiles(files, field);
    const id = String(await CLAIM.run(this.redis, [skillNameKey(ws)], [checked.name, newId('skill')]));
    const keyList = [skillKeys(id).versions, '', claimsKey(id)];
    const claim = once?.claim ?? (requestKey === undefined ? '' : `request:${sha256Hex(`${requestKey}\0${checked.digest}`)}`);
    for (let attempt = 0; attempt < 8; attempt++) {
      const existing = await this.docs.get<SkillDoc>(tags.workspace(ws), id);
      const n = (await this.redis.hlen(skillKeys(id).versions)) + 1;
      const now = nowIso();
      const version: SkillVersion = {
        type: 'skill_version', skill_id: id, name: checked.name, description: checked.description, version: n, origin,
        files: checked.entries, file_count: checked.entries.length, total_bytes: checked.total, content_sha256: checked.digest, created_at: now,
      };
      const byPath = new Map(files.map((f) => [f.path, f]));
      const stored = checked.entries.map((e) => ({ path: e.path, executable: e.executable, content_base64: (byPath.get(e.path) as SkillFile).content.toString('base64') }));
      keyList[1] = skillKeys(id).files(n);
      const reuseAbove = once ? 0 : (existing?.latest_version ?? 0);
      const answer = Number(await APPEND.run(this.redis, keyList, [String(n), JSON.stringify(version), JSON.stringify(stored), checked.digest, claim, String(reuseAbove)]));
      if (answer === 0) continue;
      if (answer < 0) {
        // Already published (by this claim, or as the latest version): that version, its head brought up to it.
        const held = await this.version(id, -answer);
        return { skill: await this.headAt(ws, id, existing, held, now), version: held, created: false };
      }
      crashPoint('skill-version-appended');
      return { skill: await this.headAt(ws, id, existing, version, now), version, created: true };
    }
    throw new ApiError('validation.conflict', `another version of skill '${checked.name}' was written at the same time; retry`);
  }

  /**
   * The skill's head at `version` at least: created with it when there is none yet (the first
   * version), else moved forward to it (a newer head is left as it is).
   */
  private async headAt(ws: string, id: string, existing: SkillDoc | null, version: SkillVersion, now: string): Promise<SkillDoc> {
    const n = version.version;
    if (!existing) {
      const skill: SkillDoc = {
        id, type: 'skill', workspace_id: ws, name: version.name, description: version.description, latest_version: n, archived_at: null,
        version: 1, created_at: now, updated_at: now,
      };
      if (await this.docs.create(tags.workspace(ws), skill, [SKILL_INDEX])) return skill;
    }
    return this.docs.update<SkillDoc>(tags.workspace(ws), id, (cur) => cur.latest_version >= n ? null : {
      ...cur, latest_version: n, description: version.description, archived_at: null,
    }, { notFound: `skill ${id}` });
  }

  /** The Workspace's Skill, its head brought up to the versions it holds (`publish`). */
  async get(ws: string, id: string): Promise<SkillDoc> {
    const doc = await this.docs.get<SkillDoc>(tags.workspace(ws), id);
    if (doc && (doc.type !== 'skill' || doc.workspace_id !== ws)) throw new ApiError('validation.not_found', `skill ${id} not found`);
    const repaired = await this.repair(ws, id, doc);
    if (!repaired) throw new ApiError('validation.not_found', `skill ${id} not found`);
    return repaired;
  }

  /**
   * The head of a Skill whose latest version it does not show (a publish died between its append
   * and its head) brought up to that version; created with it when even the first version's head
   * is missing, if the Workspace's name claim is this Skill's (the versions do not name their
   * Workspace).
   */
  private async repair(ws: string, id: string, doc: SkillDoc | null): Promise<SkillDoc | null> {
    const held = await this.redis.hlen(skillKeys(id).versions);
    if (held === 0 || (doc && doc.latest_version >= held)) return doc;
    const latest = await this.reader.version(id, held);
    if (!latest) return doc;
    if (!doc && (await this.redis.hget(skillNameKey(ws), latest.name)) !== id) return null;
    return this.headAt(ws, id, doc, latest, latest.created_at);
  }

  async view(doc: SkillDoc): Promise<SkillView> {
    return { ...doc, latest: await this.version(doc.id, doc.latest_version) };
  }

  list(ws: string, options: { limit: number; page?: string | undefined; includeArchived: boolean }): Promise<ListPage<SkillDoc>> {
    return this.docs.list<SkillDoc>(tags.workspace(ws), SKILL_INDEX, { limit: options.limit, page: options.page, order: 'asc' },
      options.includeArchived ? undefined : (d) => d.archived_at === null);
  }

  async version(id: string, n: number): Promise<SkillVersion> {
    const v = await this.reader.version(id, n);
    if (!v) throw new ApiError('validation.not_found', `skill ${id} has no version ${n}`);
    return v;
  }

  async files(id: string, n: number): Promise<SkillFile[]> {
    const f = await this.reader.files(id, n);
    if (!f) throw new ApiError('validation.not_found', `skill ${id} has no version ${n}`);
    return f;
  }

  /** Archived skills are not listed and cannot be newly selected; Agents that already select a version keep it. */
  async archive(ws: string, id: string): Promise<SkillDoc> {
    await this.get(ws, id);
    return this.docs.update<SkillDoc>(tags.workspace(ws), id, (cur) => cur.archived_at !== null ? null : { ...cur, archived_at: nowIso() }, { notFound: `skill ${id}` });
  }

  /** An Agent's selections must name live Skills at versions they have (404 otherwise). */
  async checkSelections(ws: string, selections: readonly SkillSelection[], field: string): Promise<void> {
    const names = new Set<string>();
    for (const [i, s] of selections.entries()) {
      if (names.has(s.name)) throw new ApiError('validation.malformed', `${field}[${i}].name: '${s.name}' is selected twice`);
      names.add(s.name);
      const doc = await this.reader.byName(ws, s.name);
      if (!doc || doc.archived_at !== null) throw new ApiError('validation.not_found', `${field}[${i}]: no skill named '${s.name}' in this workspace`);
      if (s.version > doc.latest_version) throw new ApiError('validation.not_found', `${field}[${i}]: skill '${s.name}' has no version ${s.version}`);
    }
  }
}
