import { ApiError, newId, nowIso } from '@agentplane/core';
import { LuaScript, tags, type DocumentStore, type ListPage, type Redis } from '@agentplane/store';
import {
  checkSkillFiles, SKILL_INDEX, SkillReader, skillKeys, skillNameKey, type SkillDoc, type SkillFile, type SkillSelection, type SkillVersion,
} from '@agentplane/domain';

/**
 * Appends version `ARGV[1]` of a skill only if it holds exactly `ARGV[1] - 1` versions, with its
 * files. KEYS: versions hash, files key.
 */
const APPEND = new LuaScript('skill_append_version', `
if redis.call('HLEN', KEYS[1]) ~= tonumber(ARGV[1]) - 1 then return 0 end
redis.call('SET', KEYS[2], ARGV[3])
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
return 1`);

/** Claims a skill name in the Workspace (KEYS[1] = the names hash): the existing id, or ARGV[2] newly claimed. */
const CLAIM = new LuaScript('skill_claim_name', `
local cur = redis.call('HGET', KEYS[1], ARGV[1])
if cur then return cur end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
return ARGV[2]`);

export type SkillView = SkillDoc & { latest: SkillVersion };

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
   */
  async publish(ws: string, files: readonly SkillFile[], origin: SkillVersion['origin'], field: string): Promise<{ skill: SkillDoc; version: SkillVersion }> {
    const checked = checkSkillFiles(files, field);
    const id = String(await CLAIM.run(this.redis, [skillNameKey(ws)], [checked.name, newId('skill')]));
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
      const ok = await APPEND.run(this.redis, [skillKeys(id).versions, skillKeys(id).files(n)], [String(n), JSON.stringify(version), JSON.stringify(stored)]);
      if (ok !== 1) continue;
      if (!existing) {
        const skill: SkillDoc = {
          id, type: 'skill', workspace_id: ws, name: checked.name, description: checked.description, latest_version: n, archived_at: null,
          version: 1, created_at: now, updated_at: now,
        };
        if (await this.docs.create(tags.workspace(ws), skill, [SKILL_INDEX])) return { skill, version };
      }
      const skill = await this.docs.update<SkillDoc>(tags.workspace(ws), id, (cur) => cur.latest_version >= n ? null : {
        ...cur, latest_version: n, description: checked.description, archived_at: null,
      }, { notFound: `skill ${id}` });
      return { skill, version };
    }
    throw new ApiError('validation.conflict', `another version of skill '${checked.name}' was written at the same time; retry`);
  }

  async get(ws: string, id: string): Promise<SkillDoc> {
    const doc = await this.docs.get<SkillDoc>(tags.workspace(ws), id);
    if (!doc || doc.type !== 'skill' || doc.workspace_id !== ws) throw new ApiError('validation.not_found', `skill ${id} not found`);
    return doc;
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
