/**
 * The lease offer's Session resources as sources the materialiser can load: Files come from
 * the control plane's runtime file route with the lease's runtime bearer (checked against the
 * digest the offer names), repositories are cloned on this machine with git (the sandbox has
 * no network).
 */
import { createHash } from 'node:crypto';
import { apiUrl } from '@agentplane/core';
import { InfrastructureFailure } from '../failures.js';
import { fetchRepositorySnapshot, RepositoryFetchError } from './repository.js';
import type { ResourceSource } from './resources.js';

/** A resource as the turn spec carries it (see the API's `SpecResource`). */
export type OfferedResource =
  | { type: 'file'; id: string; file_id: string; mount_path: string; sha256: string | null; size_bytes: number; missing?: boolean }
  | { type: 'repository'; id: string; url: string; ref: string | null; mount_path: string }
  | { type: 'uploaded_project'; id: string; project_id: string; revision_number: number; mount_path: string };

export interface SourceOptions {
  /** The control plane. */
  baseUrl: string;
  /** The lease's runtime bearer (`spec.runtime_files.bearer`). */
  bearer?: string | undefined;
  repositoryMaxBytes?: number;
  repositoryTimeoutMs?: number;
}

/** Raised for a resource that can never be placed (deleted File, unknown repository): the turn ends with it. */
export class ResourceError extends Error {
  constructor(message: string) {
    super(message);
    this.name = 'ResourceError';
  }
}

export function isOfferedResource(value: unknown): value is OfferedResource {
  const r = value as Partial<Record<string, unknown>> | null;
  if (!r || typeof r !== 'object' || typeof r.id !== 'string' || typeof r.mount_path !== 'string') return false;
  if (r.type === 'file') return typeof r.file_id === 'string';
  if (r.type === 'repository') return typeof r.url === 'string';
  if (r.type === 'uploaded_project') return typeof r.project_id === 'string' && Number.isInteger(r.revision_number);
  return false;
}

async function downloadFile(r: Extract<OfferedResource, { type: 'file' }>, o: SourceOptions, signal?: AbortSignal): Promise<Buffer> {
  if (!o.bearer) throw new ResourceError(`resource ${r.id}: the offer carries no bearer to fetch file ${r.file_id}`);
  let res: Response;
  try {
    res = await fetch(apiUrl(o.baseUrl, `/v1/runtime/files/${encodeURIComponent(r.file_id)}`), { headers: { authorization: `Bearer ${o.bearer}` }, signal: signal ?? null });
  } catch (err) {
    throw new InfrastructureFailure(`resource ${r.id}: the control plane did not serve file ${r.file_id}: ${(err as Error).message}`, { cause: err });
  }
  if (res.status === 404) throw new ResourceError(`resource ${r.id}: file ${r.file_id} no longer exists`);
  if (res.status !== 200) throw new InfrastructureFailure(`resource ${r.id}: fetching file ${r.file_id} answered HTTP ${res.status}`);
  const data = Buffer.from(await res.arrayBuffer());
  const digest = `sha256:${createHash('sha256').update(data).digest('hex')}`;
  if (digest !== r.sha256) throw new InfrastructureFailure(`resource ${r.id}: file ${r.file_id} arrived with digest ${digest}, expected ${r.sha256}`);
  return data;
}

/**
 * The Session's vault credential for an HTTPS repository, asked of the control plane with the
 * lease's runtime bearer; null when no vault holds one. It goes only into the environment of this
 * runner's git processes, as an `http.<origin>/.extraHeader` scoped to the repository's origin:
 * never onto a command line, into the checkout's `.git/config`, the sandbox, a log or an error.
 */
async function gitCredentialEnv(r: Extract<OfferedResource, { type: 'repository' }>, o: SourceOptions, signal?: AbortSignal): Promise<NodeJS.ProcessEnv | undefined> {
  if (!o.bearer || !r.url.startsWith('https://')) return undefined;
  let res: Response;
  try {
    res = await fetch(apiUrl(o.baseUrl, '/v1/runtime/git-credentials'), {
      method: 'POST', headers: { authorization: `Bearer ${o.bearer}`, 'content-type': 'application/json' }, body: JSON.stringify({ url: r.url }), signal: signal ?? null,
    });
  } catch (err) {
    throw new InfrastructureFailure(`resource ${r.id}: the control plane did not answer for repository credentials: ${(err as Error).message}`, { cause: err });
  }
  if (res.status === 404) {
    await res.body?.cancel();
    return undefined;
  }
  if (res.status !== 200) {
    await res.body?.cancel();
    throw new InfrastructureFailure(`resource ${r.id}: asking for repository credentials answered HTTP ${res.status}`);
  }
  const c = (await res.json()) as { username?: unknown; password?: unknown };
  if (typeof c.username !== 'string' || typeof c.password !== 'string') throw new InfrastructureFailure(`resource ${r.id}: malformed repository credentials`);
  const origin = new URL(r.url).origin;
  const basic = Buffer.from(`${c.username}:${c.password}`, 'utf8').toString('base64');
  const count = Number(process.env.GIT_CONFIG_COUNT ?? 0) || 0;
  return {
    ...process.env,
    GIT_CONFIG_COUNT: String(count + 1),
    [`GIT_CONFIG_KEY_${count}`]: `http.${origin}/.extraHeader`,
    [`GIT_CONFIG_VALUE_${count}`]: `Authorization: Basic ${basic}`,
  };
}

/** A Project revision's files, from the control plane with the lease's runtime bearer. */
async function downloadProject(r: Extract<OfferedResource, { type: 'uploaded_project' }>, o: SourceOptions, signal?: AbortSignal): Promise<Array<{ path: string; content: Buffer; mode: number }>> {
  if (!o.bearer) throw new ResourceError(`resource ${r.id}: the offer carries no bearer to fetch project ${r.project_id}`);
  const path = `/v1/runtime/projects/${encodeURIComponent(r.project_id)}/revisions/${r.revision_number}`;
  let res: Response;
  try {
    res = await fetch(apiUrl(o.baseUrl, path), { headers: { authorization: `Bearer ${o.bearer}` }, signal: signal ?? null });
  } catch (err) {
    throw new InfrastructureFailure(`resource ${r.id}: the control plane did not serve project ${r.project_id}: ${(err as Error).message}`, { cause: err });
  }
  if (res.status === 404) throw new ResourceError(`resource ${r.id}: revision ${r.revision_number} of project ${r.project_id} no longer exists`);
  if (res.status !== 200) throw new InfrastructureFailure(`resource ${r.id}: fetching project ${r.project_id} answered HTTP ${res.status}`);
  const body = (await res.json()) as { files?: Array<{ path?: unknown; executable?: unknown; content_base64?: unknown }> };
  return (body.files ?? []).map((f) => {
    if (typeof f.path !== 'string' || typeof f.content_base64 !== 'string') throw new InfrastructureFailure(`resource ${r.id}: malformed project revision`);
    return { path: f.path, content: Buffer.from(f.content_base64, 'base64'), mode: f.executable === true ? 0o755 : 0o644 };
  });
}

/** A skill as the turn spec carries it (see the API's `SpecSkill`). */
export interface OfferedSkill {
  ref: string;
  name: string;
  description: string;
  mount_path: string;
}

export function isOfferedSkill(value: unknown): value is OfferedSkill {
  const s = value as Partial<Record<string, unknown>> | null;
  return !!s && typeof s === 'object' && typeof s.ref === 'string' && typeof s.name === 'string' && /^[a-z0-9](?:[a-z0-9._-]{0,93})$/.test(s.name)
    && typeof s.description === 'string' && typeof s.mount_path === 'string';
}

/**
 * The turn's skills as sources: each one's files from `/v1/runtime/skills/{ref}`, placed
 * read-only under its mount path. A ref names immutable content (a Skill version, a drafted
 * proposal), so it is its identity.
 */
export function skillSources(skills: readonly OfferedSkill[], o: SourceOptions): ResourceSource[] {
  return skills.map((k): ResourceSource => ({
    id: `skill:${k.name}`, type: 'skill', mount_path: k.mount_path, identity: `skill:${k.ref}`,
    async load(signal) {
      if (!o.bearer) throw new ResourceError(`skill ${k.name}: the offer carries no bearer to fetch it`);
      let res: Response;
      try {
        res = await fetch(apiUrl(o.baseUrl, `/v1/runtime/skills/${encodeURIComponent(k.ref)}`), { headers: { authorization: `Bearer ${o.bearer}` }, signal: signal ?? null });
      } catch (err) {
        throw new InfrastructureFailure(`skill ${k.name}: the control plane did not serve it: ${(err as Error).message}`, { cause: err });
      }
      if (res.status === 404) throw new ResourceError(`skill ${k.name} (${k.ref}) no longer exists`);
      if (res.status !== 200) throw new InfrastructureFailure(`skill ${k.name}: fetching it answered HTTP ${res.status}`);
      const body = (await res.json()) as { files?: Array<{ path?: unknown; content_base64?: unknown }> };
      const files = (body.files ?? []).map((f) => {
        if (typeof f.path !== 'string' || typeof f.content_base64 !== 'string') throw new InfrastructureFailure(`skill ${k.name}: malformed skill files`);
        return { path: f.path, content: Buffer.from(f.content_base64, 'base64') };
      });
      return { kind: 'files', files, readOnly: true };
    },
  }));
}

/** Sources for the offered resources, in order. Nothing is fetched until a source is loaded. */
export function offeredSources(resources: readonly OfferedResource[], o: SourceOptions): ResourceSource[] {
  return resources.map((r): ResourceSource => {
    if (r.type === 'uploaded_project') {
      return {
        id: r.id, type: 'uploaded_project', mount_path: r.mount_path,
        // Revisions are immutable: the pinned revision names the content.
        identity: `project:${r.project_id}@${r.revision_number}`,
        async load(signal) {
          return { kind: 'files', files: await downloadProject(r, o, signal) };
        },
      };
    }
    if (r.type === 'file') {
      return {
        id: r.id, type: 'file', mount_path: r.mount_path,
        // Files are immutable: the id names the content (and a deleted File already placed stays placed).
        identity: `file:${r.file_id}`,
        async load(signal) {
          if (r.missing || !r.sha256) throw new ResourceError(`resource ${r.id}: file ${r.file_id} no longer exists`);
          return { kind: 'bytes', data: await downloadFile(r, o, signal) };
        },
      };
    }
    return {
      id: r.id, type: 'repository', mount_path: r.mount_path,
      identity: `${r.url}#${r.ref ?? ''}`,
      async load(signal) {
        const env = await gitCredentialEnv(r, o, signal);
        try {
          const snap = await fetchRepositorySnapshot({
            url: r.url, ref: r.ref, ...(env ? { env } : {}),
            ...(o.repositoryMaxBytes ? { maxBytes: o.repositoryMaxBytes } : {}),
            ...(o.repositoryTimeoutMs ? { timeoutMs: o.repositoryTimeoutMs } : {}),
            ...(signal ? { signal } : {}),
          });
          return { kind: 'tar', data: snap.tar };
        } catch (err) {
          if (err instanceof RepositoryFetchError) {
            const what = `resource ${r.id}: repository ${err.message}`;
            // A host that timed out or failed may work on a retry; a wrong URL, ref or credential will not.
            if (err.reason === 'timeout' || err.reason === 'failed') throw new InfrastructureFailure(what, { cause: err });
            throw new ResourceError(what);
          }
          throw err;
        }
      },
    };
  });
}
