import { isIP } from 'node:net';
import { ApiError, newId, nowIso } from '@agentplane/core';
import { tags, type DocumentStore, type ListPage, type StoredDoc } from '@agentplane/store';
import { checkHost, EgressRefused, resolveAllowed, type EgressPolicy } from '@agentplane/core';
import type { GitRemote } from './git.js';

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

/** The network address of a git source: how git reaches it, its host (as the guard reads it) and port. */
interface GitHost {
  transport: 'https' | 'ssh';
  host: string;
  port: number | null;
}

/**
 * A git address's host, normalised as a URL parser reads it (`0x7f.1` is `127.0.0.1`); throws
 * when it is not a host name or an address (it could not be handed to git safely).
 */
function hostOfSource(url: string): GitHost {
  const bad = () => new ApiError('validation.malformed', 'body.url: not a git address');
  let transport: GitHost['transport'];
  let raw: string;
  let port: number | null = null;
  if (url.startsWith('https://') || url.startsWith('ssh://')) {
    let u: URL;
    try {
      u = new URL(url);
    } catch {
      throw bad();
    }
    transport = u.protocol === 'https:' ? 'https' : 'ssh';
    raw = u.hostname;
    port = u.port ? Number(u.port) : transport === 'https' ? 443 : null;
  } else {
    transport = 'ssh';
    raw = /^[A-Za-z0-9._-]+@([A-Za-z0-9.-]+):/.exec(url)?.[1] ?? '';
  }
  let host: string;
  try {
    host = new URL(`https://${raw}/`).hostname;
  } catch {
    throw bad();
  }
  if (!/^[a-z0-9._-]+$/.test(host) && !/^\[[0-9a-f:.]+\]$/.test(host)) throw bad();
  return { transport, host, port };
}

/**
 * Where a source may live: `https://`, `ssh://` and scp-like `user@host:path` addresses whose
 * host passes the outbound address guard as written (no loopback host outside development mode,
 * no other private or reserved address unless the operator allows private networks); a local
 * repository (`file://` or an absolute path) only where the deployment allows it
 * (`SKILL_SOURCES_ALLOW_LOCAL`, e.g. a single-machine install or tests).
 */
export function checkSourceUrl(url: string, allowLocal: boolean, egress: EgressPolicy): void {
  if (/[\0-\x20\x7f]/.test(url) || url.startsWith('-')) throw new ApiError('validation.malformed', 'body.url: not a git address');
  if (/^https:\/\/[^/]+\/.+/.test(url) || /^ssh:\/\/[^/]+\/.+/.test(url) || /^[A-Za-z0-9._-]+@[A-Za-z0-9.-]+:[^/].*/.test(url)) {
    // A credential in the address would be stored and shown to every reader of the source:
    // private remotes authenticate with the api host's SSH agent (docs/SKILLS.md).
    if (url.startsWith('https://') || url.startsWith('ssh://')) {
      let parsed: URL;
      try {
        parsed = new URL(url);
      } catch {
        throw new ApiError('validation.malformed', 'body.url: not a git address');
      }
      if (parsed.password !== '' || (url.startsWith('https://') && parsed.username !== '')) {
        throw new ApiError('validation.malformed', 'body.url: an address may not carry a credential (user or password); a private remote authenticates with the api host\'s SSH agent');
      }
    }
    checkHost(hostOfSource(url).host, egress);
    return;
  }
  if ((url.startsWith('file:///') || url.startsWith('/')) && !url.includes('/../')) {
    if (allowLocal) return;
    throw new ApiError('validation.malformed', 'body.url: local repositories are not allowed on this deployment; use an https:// or ssh:// address');
  }
  throw new ApiError('validation.malformed', 'body.url: use an https://, ssh:// or user@host:path git address');
}

/** `GIT_CONFIG_COUNT`/`GIT_CONFIG_KEY_<n>`/`GIT_CONFIG_VALUE_<n>`: settings git reads from its environment. */
function gitConfigEnv(pairs: ReadonlyArray<readonly [string, string]>): Record<string, string> {
  const env: Record<string, string> = { GIT_CONFIG_COUNT: String(pairs.length) };
  pairs.forEach(([k, v], i) => {
    env[`GIT_CONFIG_KEY_${i}`] = k;
    env[`GIT_CONFIG_VALUE_${i}`] = v;
  });
  return env;
}

export class SkillSourceService {
  constructor(private readonly docs: DocumentStore, private readonly allowLocal: boolean, private readonly egress: EgressPolicy) {}

  async create(ws: string, input: { name: string; url: string; default_branch?: string | undefined; path?: string | undefined }, id = newId('skillSource')): Promise<SkillSourceDoc> {
    checkSourceUrl(input.url, this.allowLocal, this.egress);
    const branch = input.default_branch ?? 'main';
    if (!isBranchName(branch)) throw new ApiError('validation.malformed', 'body.default_branch: not a branch name');
    const path = (input.path ?? 'skills').replace(/^\/+|\/+$/g, '');
    if (path === '' || path.split('/').some((s) => s === '' || s === '.' || s === '..') || /[\0-\x1f\\]/.test(path)) {
      throw new ApiError('validation.malformed', 'body.path: a relative directory of the repository');
    }
    const now = nowIso();
    const doc: SkillSourceDoc = {
      id, type: 'skill_source', workspace_id: ws, name: input.name, url: input.url, default_branch: branch, path,
      version: 1, created_at: now, updated_at: now,
    };
    await this.docs.create(tags.workspace(ws), doc, [INDEX]);
    return doc;
  }

  /**
   * How git reaches the source for one operation (a submission, an adoption check). A network
   * source's host is resolved now and every address it resolves to must pass the outbound guard
   * (400 `validation.malformed` otherwise, before git connects anywhere); git is then held to the
   * first of them (https: curl's resolve entry; ssh: the address as the host name, the written
   * host still naming the host key) and follows no HTTP redirect, so neither a DNS answer that
   * changes in between nor a redirect reaches another address.
   */
  async remote(source: SkillSourceDoc): Promise<GitRemote> {
    if (!/^(https|ssh):\/\//.test(source.url) && !/^[A-Za-z0-9._-]+@[A-Za-z0-9.-]+:/.test(source.url)) return { url: source.url, env: {} };
    const { transport, host, port } = hostOfSource(source.url);
    let target: { address: string; family: 4 | 6 };
    try {
      target = await resolveAllowed(host, this.egress);
    } catch (err) {
      if (err instanceof EgressRefused) {
        throw new ApiError('validation.malformed', `skill source ${source.id}: its host ${host} resolves to a private or reserved address, which this platform does not reach`);
      }
      throw err;
    }
    const bare = host.replace(/^\[|\]$/g, '').replace(/\.$/, '');
    const literal = isIP(bare) !== 0;
    if (transport === 'https') {
      const pairs: Array<[string, string]> = [['http.followRedirects', 'false']];
      if (!literal) {
        const address = target.family === 6 ? `[${target.address}]` : target.address;
        // Both spellings of a fully qualified name: curl drops the root dot before it looks up.
        for (const name of new Set([host, host.replace(/\.$/, '')])) pairs.push(['http.curloptResolve', `${name}:${port ?? 443}:${address}`]);
      }
      // The address as parsed here, so that curl reads the very host name the entry names.
      return { url: new URL(source.url).href, env: gitConfigEnv(pairs) };
    }
    // ssh connects to the address checked whatever spelling of the host git hands it; the api
    // host's own GIT_SSH_COMMAND (a key, a known-hosts file) is the command the pin extends.
    const ssh = process.env.GIT_SSH_COMMAND?.trim() || 'ssh';
    return { url: source.url, env: gitConfigEnv([['core.sshCommand', `${ssh} -o HostName=${target.address} -o HostKeyAlias=${bare}`]]) };
  }

  /** The skill source stored under `id` in the Workspace; null when there is none. */
  find(ws: string, id: string): Promise<SkillSourceDoc | null> {
    return this.docs.get<SkillSourceDoc>(tags.workspace(ws), id);
  }

  async get(ws: string, id: string): Promise<SkillSourceDoc> {
    const doc = await this.find(ws, id);
    if (!doc || doc.type !== 'skill_source' || doc.workspace_id !== ws) throw new ApiError('validation.not_found', `skill source ${id} not found`);
    return doc;
  }

  list(ws: string, options: { limit: number; page?: string | undefined }): Promise<ListPage<SkillSourceDoc>> {
    return this.docs.list<SkillSourceDoc>(tags.workspace(ws), INDEX, { ...options, order: 'asc' });
  }
}
