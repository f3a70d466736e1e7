import { createHash } from 'node:crypto';
import { ApiError, LOGICAL_KEY_PATTERN } from '@agentplane/core';
import { keys, tags, type DocumentStore, type Redis, type StoredDoc } from '@agentplane/store';
import { SKILL_TOOL_NAME, SKILLS_DIR } from '@agentplane/protocol';

const MiB = 1024 * 1024;

/** The contract's Skill limits (`POST /v1/skills`, `/v1/skills/import`); every breach is 400. */
export const SKILL_LIMITS = Object.freeze({
  /** `SKILL.md` (the instructions). */
  maxInstructionsBytes: MiB,
  maxFiles: 256,
  maxFileBytes: MiB,
  maxTotalBytes: 2 * MiB,
  /** An imported tar archive, headers and padding included. */
  maxArchiveBytes: 4 * MiB,
  maxPathChars: 512,
  maxDescriptionChars: 1024,
});

/** The file every Skill directory has: front matter (`name`, `description`) then the instructions. */
export const SKILL_ENTRY = 'SKILL.md';

/** Where a Run places its skills, and the built-in tool it opens them with: the runner protocol's. */
export { SKILL_TOOL_NAME, SKILLS_DIR };

export const SKILL_NAME_RE = new RegExp(LOGICAL_KEY_PATTERN);

/** A Skill: a name in the Workspace with immutable numbered versions. */
export interface SkillDoc extends StoredDoc {
  type: 'skill';
  workspace_id: string;
  name: string;
  /** The description of the latest version. */
  description: string;
  latest_version: number;
  archived_at: string | null;
}

export interface SkillFileEntry {
  path: string;
  size_bytes: number;
  sha256: string;
  executable: boolean;
}

/** One immutable version: its manifest (the files live in `{k:<skill>}:files:<n>`). */
export interface SkillVersion {
  type: 'skill_version';
  skill_id: string;
  name: string;
  description: string;
  version: number;
  /** `api` (`POST /v1/skills`), `import` (a tar archive) or `source` (read from a skill source). */
  origin: 'api' | 'import' | 'source';
  files: SkillFileEntry[];
  file_count: number;
  total_bytes: number;
  content_sha256: string;
  created_at: string;
}

export interface SkillFile {
  path: string;
  content: Buffer;
  executable: boolean;
}

export function skillKeys(skillId: string) {
  const tag = tags.skill(skillId);
  return { versions: keys.scoped(tag, 'versions'), files: (n: number) => keys.scoped(tag, `files:${n}`) };
}

export const SKILL_INDEX = 'skills';
export const skillNameKey = (ws: string) => keys.unique(tags.workspace(ws), 'skills');

const bad = (message: string) => new ApiError('validation.malformed', message);

/** A relative path inside the skill directory: no leading `/`, no empty, `.` or `..` segment, no backslash or control character. */
export function checkSkillPath(path: string, field: string): void {
  if (path.length === 0 || path.length > SKILL_LIMITS.maxPathChars) throw bad(`${field}: a path is 1 to ${SKILL_LIMITS.maxPathChars} characters`);
  if (path.startsWith('/') || /[\0-\x1f\x7f\\]/.test(path) || path.split('/').some((s) => s === '' || s === '.' || s === '..')) {
    throw bad(`${field}: '${path.slice(0, 80)}' escapes the skill directory or is not a plain relative path`);
  }
}

/**
 * A front matter value as YAML reads a quoted scalar: double quotes with their escapes (`\"`,
 * `\\`, `\uXXXX`, which `renderSkillMd` writes), single quotes with `''` for a quote; anything
 * else as written.
 */
function unquote(v: string): string {
  if (v.length >= 2 && v.startsWith('"') && v.endsWith('"')) {
    try {
      const parsed: unknown = JSON.parse(v);
      if (typeof parsed === 'string') return parsed;
    } catch {
      // Not JSON's subset of the YAML escapes: the text between the quotes.
    }
    return v.slice(1, -1);
  }
  if (v.length >= 2 && v.startsWith("'") && v.endsWith("'")) return v.slice(1, -1).replace(/''/g, "'");
  return v;
}

/**
 * The `name` and `description` of a `SKILL.md` front matter block (`---` lines around
 * `key: value` lines; values may be quoted). Anything else in the block is kept in the file
 * but not read here.
 */
export function parseFrontMatter(text: string): { name: string; description: string; body: string } {
  const m = /^---[ \t]*\r?\n([\s\S]*?)\r?\n---[ \t]*(?:\r?\n|$)/.exec(text);
  if (!m) throw bad(`${SKILL_ENTRY}: must start with a front matter block ('---' lines) naming the skill's name and description`);
  const fields = new Map<string, string>();
  for (const line of (m[1] ?? '').split(/\r?\n/)) {
    const kv = /^([A-Za-z_][A-Za-z0-9_-]*)\s*:\s*(.*)$/.exec(line);
    if (!kv) continue;
    fields.set(kv[1] ?? '', unquote((kv[2] ?? '').trim()));
  }
  const name = fields.get('name') ?? '';
  const description = fields.get('description') ?? '';
  if (!SKILL_NAME_RE.test(name)) throw bad(`${SKILL_ENTRY}: front matter 'name' must match ${LOGICAL_KEY_PATTERN}`);
  if (description.length === 0 || description.length > SKILL_LIMITS.maxDescriptionChars) {
    throw bad(`${SKILL_ENTRY}: front matter 'description' is 1 to ${SKILL_LIMITS.maxDescriptionChars} characters`);
  }
  return { name, description, body: text.slice(m[0].length) };
}

/** A `SKILL.md` from its parts. */
export function renderSkillMd(name: string, description: string, body: string): string {
  const desc = /[:#'"\n]|^\s|\s$/.test(description) ? JSON.stringify(description.replace(/\n/g, ' ')) : description;
  return `---\nname: ${name}\ndescription: ${desc}\n---\n\n${body.replace(/^\n+/, '')}${body.endsWith('\n') ? '' : '\n'}`;
}

const sha256 = (b: Buffer | string) => createHash('sha256').update(b).digest('hex');

/**
 * The digest of a skill directory: sha256 over `path NUL mode NUL sha256(content) LF` for every
 * file in path order. Independent of how the files arrived (JSON, tar, git).
 */
export function skillContentDigest(files: ReadonlyArray<{ path: string; sha256: string; executable: boolean }>): string {
  const lines = [...files].sort((a, b) => (a.path < b.path ? -1 : a.path > b.path ? 1 : 0))
    .map((f) => `${f.path}\0${f.executable ? '755' : '644'}\0${f.sha256.replace(/^sha256:/, '')}\n`).join('');
  return `sha256:${sha256(lines)}`;
}

/** Checks a complete skill directory against every limit; returns its manifest. */
export function checkSkillFiles(files: readonly SkillFile[], field: string): { entries: SkillFileEntry[]; name: string; description: string; total: number; digest: string } {
  if (files.length === 0) throw bad(`${field}: a skill holds at least ${SKILL_ENTRY}`);
  if (files.length > SKILL_LIMITS.maxFiles) throw bad(`${field}: ${files.length} files; a skill holds at most ${SKILL_LIMITS.maxFiles}`);
  const seen = new Set<string>();
  let total = 0;
  const entries = files.map((f, i) => {
    checkSkillPath(f.path, `${field}[${i}].path`);
    if (seen.has(f.path)) throw bad(`${field}[${i}].path: '${f.path.slice(0, 80)}' appears twice`);
    seen.add(f.path);
    if (f.content.length > SKILL_LIMITS.maxFileBytes) throw bad(`${field}[${i}]: ${f.content.length} bytes; a skill file holds at most ${SKILL_LIMITS.maxFileBytes} bytes (1 MiB)`);
    total += f.content.length;
    if (total > SKILL_LIMITS.maxTotalBytes) throw bad(`${field}: more than ${SKILL_LIMITS.maxTotalBytes} bytes; a skill holds at most 2 MiB across its files`);
    return { path: f.path, size_bytes: f.content.length, sha256: `sha256:${sha256(f.content)}`, executable: f.executable };
  });
  for (const p of seen) {
    const parts = p.split('/');
    for (let i = 1; i < parts.length; i++) {
      const dir = parts.slice(0, i).join('/');
      if (seen.has(dir)) throw bad(`${field}: '${dir.slice(0, 80)}' is a file and a directory of '${p.slice(0, 80)}'`);
    }
  }
  const entry = files.find((f) => f.path === SKILL_ENTRY);
  if (!entry) throw bad(`${field}: a skill directory has a ${SKILL_ENTRY} at its root`);
  if (entry.content.length > SKILL_LIMITS.maxInstructionsBytes) throw bad(`${SKILL_ENTRY}: more than 1 MiB of instructions`);
  const text = entry.content.toString('utf8');
  if (Buffer.byteLength(text) !== entry.content.length || text.includes('\uFFFD')) throw bad(`${SKILL_ENTRY}: not UTF-8 text`);
  const { name, description } = parseFrontMatter(text);
  entries.sort((a, b) => (a.path < b.path ? -1 : a.path > b.path ? 1 : 0));
  return { entries, name, description, total, digest: skillContentDigest(entries) };
}

/** A skill a Run places in its sandbox (a Skill version, or the draft of a proposal under verification). */
export interface SpecSkill {
  /** `skill_<hex>@<version>` or a `skp_` id (a proposal's drafted skill): what the runtime route serves. */
  ref: string;
  name: string;
  description: string;
  /** Workspace-relative directory the skill is placed in. */
  mount_path: string;
}

/** An Agent's selection: a Skill by name at one version. */
export interface SkillSelection {
  name: string;
  version: number;
}

/** Reads Skills straight from the store (the scheduler's view; the api's SkillService writes them). */
export class SkillReader {
  constructor(private readonly redis: Redis, private readonly docs: DocumentStore) {}

  async byName(workspaceId: string, name: string): Promise<SkillDoc | null> {
    const id = await this.redis.hget(skillNameKey(workspaceId), name);
    if (!id) return null;
    const doc = await this.docs.get<SkillDoc>(tags.workspace(workspaceId), id);
    return doc && doc.type === 'skill' && doc.workspace_id === workspaceId ? doc : null;
  }

  async version(skillId: string, n: number): Promise<SkillVersion | null> {
    const raw = await this.redis.hget(skillKeys(skillId).versions, String(n));
    return raw === null ? null : (JSON.parse(raw) as SkillVersion);
  }

  async files(skillId: string, n: number): Promise<SkillFile[] | null> {
    const raw = await this.redis.get(skillKeys(skillId).files(n));
    if (raw === null) return null;
    return (JSON.parse(raw) as Array<{ path: string; content_base64: string; executable: boolean }>)
      .map((f) => ({ path: f.path, content: Buffer.from(f.content_base64, 'base64'), executable: f.executable }));
  }

  /** An Agent's selections as the Run places them; a selection no longer resolvable is left out (the harness names what it got). */
  async resolve(workspaceId: string, selections: readonly SkillSelection[]): Promise<SpecSkill[]> {
    const out: SpecSkill[] = [];
    for (const s of selections) {
      const doc = await this.byName(workspaceId, s.name);
      const v = doc ? await this.version(doc.id, s.version) : null;
      if (!doc || !v) continue;
      out.push({ ref: `${doc.id}@${v.version}`, name: v.name, description: v.description, mount_path: `${SKILLS_DIR}/${v.name}` });
    }
    return out;
  }
}
