import type Koa from 'koa';
import { ApiError, isId } from '@agentplane/core';
import type { RuntimeBearerVerifier, SkillFile } from '@agentplane/domain';
import type { ApiDeps } from '../deps.js';
import { bearerToken } from '../http/authenticate.js';

export const RUNTIME_SKILL_PATH = /^\/v1\/runtime\/skills\/([^/]+)$/;

/**
 * `GET /v1/runtime/skills/{ref}`: the runner fetches a turn's skill here to place it in the
 * sandbox: `{files: [{path, executable, content_base64}]}`. `ref` is `skill_<hex>@<version>` (a
 * Skill version an Agent selected) or a `skp_` id (a proposal's drafted skill, for its
 * verification Session). The lease's runtime bearer only, and only for the refs its turn spec
 * carried.
 */
export function runtimeSkills(deps: ApiDeps, verifier: RuntimeBearerVerifier): Koa.Middleware {
  return async (ctx, next) => {
    const m = RUNTIME_SKILL_PATH.exec(ctx.path);
    if (!m) return next();
    if (ctx.method !== 'GET') {
      ctx.set('Allow', 'GET');
      throw new ApiError('validation.not_found', `no operation at ${ctx.method} ${ctx.path}; use GET`);
    }
    const token = bearerToken(ctx.headers.authorization);
    const grant = token ? await verifier.verify(token) : null;
    if (!grant) {
      throw new ApiError('auth.invalid_key', 'missing, unknown or expired runtime bearer (it lives only while its lease holds the Session)', {
        headers: { 'WWW-Authenticate': 'Bearer error="invalid_token"' },
      });
    }
    const ref = decodeURIComponent(m[1] ?? '');
    if (!(grant.skills ?? []).includes(ref)) throw new ApiError('validation.not_found', `skill ${ref} is not a skill of this run`);
    let files: SkillFile[];
    const at = /^(skill_[0-9a-f]{32})@([0-9]{1,9})$/.exec(ref);
    if (at) {
      await deps.skills.get(grant.workspace_id, at[1] ?? '');
      files = await deps.skills.files(at[1] ?? '', Number(at[2]));
    } else if (isId('skillProposal', ref)) {
      files = await deps.skillProposals.draft(grant.workspace_id, ref);
    } else {
      throw new ApiError('validation.malformed', 'path: not a skill reference');
    }
    ctx.status = 200;
    ctx.set('Cache-Control', 'no-store');
    ctx.body = { files: files.map((f) => ({ path: f.path, executable: f.executable, content_base64: f.content.toString('base64') })) };
  };
}
