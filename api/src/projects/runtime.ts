import type Koa from 'koa';
import { ApiError, isId } from '@agentplane/core';
import type { ApiDeps } from '../deps.js';
import { runtimeFilesRoute } from '../http/runtime-route.js';
import type { RuntimeBearerVerifier } from '@agentplane/domain';

export const RUNTIME_PROJECT_PATH = /^\/v1\/runtime\/projects\/([^/]+)\/revisions\/([0-9]{1,9})$/;

/**
 * `GET /v1/runtime/projects/{project_id}/revisions/{n}`: the runner fetches a Session's
 * `uploaded_project` revision here to mount it in the sandbox: `{files: [{path, executable,
 * content_base64}]}`. The lease's runtime bearer only, and only for the revisions the Session's
 * resources pinned when the lease was granted.
 */
export function runtimeProjects(deps: ApiDeps, verifier: RuntimeBearerVerifier): Koa.Middleware {
  return runtimeFilesRoute(RUNTIME_PROJECT_PATH, verifier, async (grant, m) => {
    const projectId = m[1] ?? '';
    const n = Number(m[2]);
    if (!isId('project', projectId)) throw new ApiError('validation.malformed', 'path.project_id: expected a proj_ id');
    if (!(grant.projects ?? []).includes(`${projectId}@${n}`)) {
      throw new ApiError('validation.not_found', `revision ${n} of project ${projectId} is not a resource of session ${grant.session_id}`);
    }
    await deps.projects.get(grant.workspace_id, projectId);
    return deps.projects.readFiles(projectId, n);
  });
}
