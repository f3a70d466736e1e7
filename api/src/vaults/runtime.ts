import type Koa from 'koa';
import { ApiError, Counter } from '@agentplane/core';
import type { ApiDeps } from '../deps.js';
import { runtimeGrant } from '../http/runtime-route.js';
import { readJsonBody } from '../http/body.js';
import { requestIdOf } from '../http/router.js';
import type { RuntimeBearerVerifier } from '@agentplane/domain';

export const RUNTIME_GIT_PATH = '/v1/runtime/git-credentials';

/**
 * `POST /v1/runtime/git-credentials` `{url}`: the runner asks, right before it fetches a Session
 * `repository` resource over HTTPS, for the credential the Session's vaults hold for that URL
 * (`git_https` secrets, `vault_ids` order, first match wins). Authenticated by the lease's runtime
 * bearer only, and only for the repository URLs the Session named when the lease was granted.
 * Answers `{username, password}`, or 404 when no vault holds one (the runner then fetches without
 * credentials). The value goes to the runner's git process through its environment, never to the
 * sandbox, an event, a log line or an error message. Every answer after authentication is an
 * audit record of the Workspace, as the Run (`vaults.releaseGitCredential`, target the vault that
 * held the secret, else the Session): succeeded, or failed with its status and error type.
 */
export function runtimeGitCredentials(deps: ApiDeps, verifier: RuntimeBearerVerifier): Koa.Middleware {
  const served = new Counter({ name: 'agentplane_runtime_git_credentials_total', help: 'Git credentials asked for by runners, by outcome', labelNames: ['outcome'], registers: [deps.metrics] });
  return async (ctx, next) => {
    if (ctx.path !== RUNTIME_GIT_PATH) return next();
    const grant = await runtimeGrant(ctx, 'POST', verifier, () => served.inc({ outcome: 'unauthorized' }));
    const record = (target: string, outcome: 'succeeded' | 'failed', status: number, detail: string | null) => deps.audit.append(grant.workspace_id, {
      actor: { id: grant.run_id, credential_id: null }, action: 'vaults.releaseGitCredential', target, outcome, status, detail, request_id: requestIdOf(ctx),
    });
    let secret: Awaited<ReturnType<ApiDeps['vaults']['resolve']>>;
    try {
      const body = (await readJsonBody(ctx.req, 16 * 1024)) as { url?: unknown } | undefined;
      const url = body?.url;
      if (typeof url !== 'string' || body === undefined || Object.keys(body).length !== 1) throw new ApiError('validation.malformed', 'body: exactly {url}');
      if (!(grant.repositories ?? []).includes(url)) {
        served.inc({ outcome: 'not_granted' });
        throw new ApiError('validation.not_found', `${url} is not a repository resource of session ${grant.session_id}`);
      }
      const session = await deps.sessions.store.get(grant.workspace_id, grant.session_id);
      secret = await deps.vaults.resolve(grant.workspace_id, session.vault_ids, ['git_https'], url);
      if (!secret) {
        served.inc({ outcome: 'none' });
        throw new ApiError('validation.not_found', 'no vault of the session holds a git_https secret for this repository');
      }
    } catch (err) {
      if (err instanceof ApiError) await record(grant.session_id, 'failed', err.status, err.type);
      throw err;
    }
    await record(secret.vault_id, 'succeeded', 200, null);
    served.inc({ outcome: 'ok' });
    ctx.status = 200;
    ctx.set('Cache-Control', 'no-store');
    ctx.body = { username: secret.username ?? 'x-access-token', password: secret.value, vault_id: secret.vault_id, secret_name: secret.name };
  };
}
