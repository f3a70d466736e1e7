import type Koa from 'koa';
import { ApiError, isId } from '@agentplane/core';
import type { RuntimeBearerVerifier, SkillFile } from '@agentplane/domain';
import type { ApiDeps } from '../deps.js';
import { runtimeFilesRoute } from '../http/runtime-route.js';

export const RUNTIME_SKILL_PATH = /^\/v1\/runtime\/skills\/([^/]+)$/;

/**
 * `GET /v1/runtime/skills/{ref}`: the runner fetches a turn's skill here to place it in the
 * sandbox: `{files: [{path, executable, content_base64}]}`. `ref` is `skill_<hex>@<version>` (a
 * Skill version an Agent selected) or a `skp_` id (a proposal's drafted skill, for its
 * verification Session). The lease's runtime bearer only, and only for the refs its turn spec
 * carried.
 */
export function runtimeSkills(deps: ApiDeps, verifier: RuntimeBearerVerifier): Koa.Middleware {
  return runtimeFilesRoute(RUNTIME_SKILL_PATH, verifier, async (grant, m): Promise<SkillFile[]> => {
    let ref: string;
    try {
      ref = decodeURIComponent(m[1] ?? '');
    } catch {
      throw new ApiError('validation.malformed', 'path: not a skill reference (malformed percent-encoding)');
    }
    if (!(grant.skills ?? []).includes(ref)) throw new ApiError('validation.not_found', `skill ${ref} is not a skill of this run`);
    const at = /^(skill_[0-9a-f]{32})@([0-9]{1,9})$/.exec(ref);
    if (at) {
      await deps.skills.get(grant.workspace_id, at[1] ?? '');
      return deps.skills.files(at[1] ?? '', Number(at[2]));
    }
    if (isId('skillProposal', ref)) return deps.skillProposals.draft(grant.workspace_id, ref);
    throw new ApiError('validation.malformed', 'path: not a skill reference');
  });
}
