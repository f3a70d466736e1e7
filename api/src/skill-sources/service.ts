import { ApiError, newId, nowIso } from '@agentplane/core';
import { tags, type DocumentStore, type ListPage, type StoredDoc } from '@agentplane/store';

/** A git repository skills are read from (adoption) and submitted to (skill proposals). */
export interface SkillSourceDoc extends StoredDoc {
  type: 'skill_source';
  workspace_id: string;
  name: string;
  url: string;
  default_branch: string;
  /** Directory of the repository holding one directory per skill (`<path>/<name>/SKILL.md`). */
  path: string;
}

const INDEX = 'skill_sources';
const BRANCH_RE = /^(?!\/)(?!.*\/\/)(?!.*\.\.)(?!.*@\{)(?!.*\.lock$)(?!.*\/$)[A-Za-z0-9._\/-]{1,200}$/;
export const isBranchName = (b: string) => BRANCH_RE.test(b) && !b.startsWith('-') && !b.endsWith('.');

/**
 * Where a source may live: `https://`, `ssh://` and scp-like `user@host:path` addresses; a
 * local repository (`file://` or an absolute path) only where the deployment allows it
 * (`SKILL_SOURCES_ALLOW_LOCAL`, e.g. a single-machine install or tests).
 */
export function checkSourceUrl(url: string, allowLocal: boolean): void {
  if (/[\0-\x20\x7f]/.test(url) || url.startsWith('-')) throw new ApiError('validation.malformed', 'body.url: not a git address');
  if (/^https:\/\/[^/]+\/.+/.test(url) || /^ssh:\/\/[^/]+\/.+/.test(url) || /^[A-Za-z0-9._-]+@[A-Za-z0-9.-]+:[^/].*/.test(url)) return;
  if ((url.startsWith('file:///') || url.startsWith('/')) && !url.includes('/../')) {
    if (allowLocal) return;
    throw new ApiError('validation.malformed', 'body.url: local repositories are not allowed on this deployment; use an https:// or ssh:// address');
  }
  throw new ApiError('validation.malformed', 'body.url: use an https://, ssh:// or user@host:path git address');
}

export class SkillSourceService {
  constructor(private readonly docs: DocumentStore, private readonly allowLocal: boolean) {}

  async create(ws: string, input: { name: string; url: string; default_branch?: string | undefined; path?: string | undefined }): Promise<SkillSourceDoc> {
    checkSourceUrl(input.url, this.allowLocal);
    const branch = input.default_branch ?? 'main';
    if (!isBranchName(branch)) throw new ApiError('validation.malformed', 'body.default_branch: not a branch name');
    const path = (input.path ?? 'skills').replace(/^\/+|\/+$/g, '');
    if (path === '' || path.split('/').some((s) => s === '' || s === '.' || s === '..') || /[\0-\x1f\\]/.test(path)) {
      throw new ApiError('validation.malformed', 'body.path: a relative directory of the repository');
    }
    const now = nowIso();
    const doc: SkillSourceDoc = {
      id: newId('skillSource'), type: 'skill_source', workspace_id: ws, name: input.name, url: input.url, default_branch: branch, path,
      version: 1, created_at: now, updated_at: now,
    };
    await this.docs.create(tags.workspace(ws), doc, [INDEX]);
    return doc;
  }

  async get(ws: string, id: string): Promise<SkillSourceDoc> {
    const doc = await this.docs.get<SkillSourceDoc>(tags.workspace(ws), id);
    if (!doc || doc.type !== 'skill_source' || doc.workspace_id !== ws) throw new ApiError('validation.not_found', `skill source ${id} not found`);
    return doc;
  }

  list(ws: string, options: { limit: number; page?: string | undefined }): Promise<ListPage<SkillSourceDoc>> {
    return this.docs.list<SkillSourceDoc>(tags.workspace(ws), INDEX, { ...options, order: 'asc' });
  }
}
