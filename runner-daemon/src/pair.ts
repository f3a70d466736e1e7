/**
 * `pair` and `enroll`: ask the control plane for a runner credential and store it in the config
 * dir. Everything that can be checked on this machine is checked before the request, since a
 * pairing code is single-use: the config dir must be writable (a write probe), no daemon may be
 * running on it, and a credential already there is replaced only with --force.
 */
import { apiUrl } from '@agentplane/core';
import { checkWritableConfigDir, credentialPath, loadCredential, loadState, RUNNER_EXIT, saveCredential, saveState, type RunnerCredentialFile } from '@agentplane/protocol';
import { CliError, errnoOf, requestFailure, UsageError } from './cli-errors.js';
import { acquireDaemonLock, DaemonRunningError, type DaemonLock } from './lock.js';

/** How long pair and enroll wait for the control plane's answer by default (--timeout). */
export const REQUEST_TIMEOUT_MS = 30_000;

export interface RedeemOptions {
  command: 'pair' | 'enroll';
  /** The control plane's base URL, as typed. */
  url: string;
  configDir: string;
  label: string;
  /** pair: the single-use pairing code. */
  code?: string;
  /** enroll: a runner-role API key. */
  apiKey?: string;
  pool?: string;
  /** Replace a credential already stored in the config dir. */
  force?: boolean;
  timeoutMs?: number;
  /** Whether a person reads the output (a terminal): only then is a secret that could not be stored shown. */
  tty: boolean;
  /** Seams for tests. */
  fetch?: typeof fetch;
  save?: typeof saveCredential;
}

export interface RedeemResult {
  human: string;
  data: Record<string, unknown>;
}

interface IssuedBody {
  secret?: string;
  runner_credential?: { id: string; runner_id: string; runner_pool_id: string; workspace_id: string };
  error?: { type: string; message: string };
}

const revokeHint = (id: string): string => `POST /v1/runner-credentials/${id}/revoke (an admin of its Workspace)`;

export async function redeemOrEnroll(o: RedeemOptions): Promise<RedeemResult> {
  const { command, url, configDir: dir } = o;
  if (!URL.canParse(url) || !/^https?:$/.test(new URL(url).protocol)) throw new UsageError(`--url must be an http(s) URL, got '${url}'`);
  if (command === 'pair' && o.code === undefined) throw new UsageError('--code is required');
  if (command === 'enroll' && (o.apiKey === undefined || o.pool === undefined)) throw new UsageError('--api-key and --pool are required');
  const timeoutMs = o.timeoutMs ?? REQUEST_TIMEOUT_MS;
  const path = credentialPath(dir);
  try {
    checkWritableConfigDir(dir);
  } catch (err) {
    throw new CliError('config', `cannot write the credential into ${dir}: ${err instanceof Error ? err.message : String(err)} ` +
      `(nothing was asked of the control plane${command === 'pair' ? '; the pairing code is still unused' : ''})`, RUNNER_EXIT.config, {}, { code: errnoOf(err) ?? null });
  }
  // A daemon running on this dir would keep using the credential this replaces; one starting now
  // waits for this command.
  let lock: DaemonLock;
  try {
    lock = acquireDaemonLock(dir);
  } catch (err) {
    if (!(err instanceof DaemonRunningError)) throw err;
    throw new CliError('already_running', `a runner daemon (pid ${err.holder.pid}) is running on ${dir}: stop it first ` +
      `(agentplane-runner drain --wait --config-dir ${dir}), or ${command} into another --config-dir`, RUNNER_EXIT.alreadyRunning, { pid: err.holder.pid });
  }
  try {
    const existing = loadCredential(dir);
    if (existing && !o.force) {
      throw new UsageError(`${dir} is already paired: ${path} holds runner ${existing.runner_id} (credential ${existing.runner_credential_id}). ` +
        `Use another --config-dir for another runner, or --force to replace it (the old credential stays active until revoked: ${revokeHint(existing.runner_credential_id)})`, false);
    }
    const body = await request(o, timeoutMs);
    const rc = body.runner_credential!;
    const file: RunnerCredentialFile = {
      base_url: url, secret: body.secret!, runner_id: rc.runner_id, runner_credential_id: rc.id, runner_pool_id: rc.runner_pool_id,
      workspace_id: rc.workspace_id, machine_label: o.label, paired_at: new Date().toISOString(),
    };
    try {
      (o.save ?? saveCredential)(dir, file);
    } catch (err) {
      // Issued but not stored: its secret is nowhere else. Say which one it is so it can be revoked.
      const shown = o.tty ? `\nIts secret, shown once because this is a terminal (write it nowhere it could leak): ${file.secret}` : '';
      throw new CliError('config', `the control plane issued runner credential ${rc.id} (runner ${rc.runner_id}, pool ${rc.runner_pool_id}) ` +
        `but it could not be stored in ${path}: ${err instanceof Error ? err.message : String(err)}. Revoke it: ${revokeHint(rc.id)}; ` +
        `then free the disk and ${command} again${command === 'pair' ? ' with a new pairing code' : ''}.${shown}`, RUNNER_EXIT.config, {
        credential_stored: false, runner_id: rc.runner_id, runner_credential_id: rc.id, runner_pool_id: rc.runner_pool_id,
        ...(o.tty ? { secret: file.secret } : {}),
      }, { code: errnoOf(err) ?? null });
    }
    // A credential the control plane already refused (the daemon recorded it) is not live there:
    // nothing to revoke. The record was of the credential replaced, so it goes with it.
    const state = existing ? loadState(dir) : null;
    const refused = state?.credential_refused ?? null;
    if (state && refused) saveState(dir, { ...state, credential_refused: null });
    const replaced = !existing
      ? ''
      : refused
        ? `\nreplaced the credential ${existing.runner_credential_id} of runner ${existing.runner_id}, which the control plane had refused (HTTP ${refused.http_status} at ${refused.at})`
        : `\nreplaced the credential ${existing.runner_credential_id} of runner ${existing.runner_id}; it stays active until revoked: ${revokeHint(existing.runner_credential_id)}`;
    return {
      human: `paired: runner ${rc.runner_id} in pool ${rc.runner_pool_id}\ncredential stored in ${path} (mode 0600)${replaced}\nnext: agentplane-runner start`,
      data: {
        ok: true, runner_id: rc.runner_id, runner_credential_id: rc.id, runner_pool_id: rc.runner_pool_id, workspace_id: rc.workspace_id, path,
        ...(existing ? { replaced: { runner_id: existing.runner_id, runner_credential_id: existing.runner_credential_id } } : {}),
      },
    };
  } finally {
    lock.release();
  }
}

/** The control plane's answer: a credential and its secret, or a CliError (api, network). */
async function request(o: RedeemOptions, timeoutMs: number): Promise<IssuedBody & Required<Pick<IssuedBody, 'secret' | 'runner_credential'>>> {
  const endpoint = o.command === 'pair'
    ? apiUrl(o.url, '/v1/runner-pairings/redeem')
    : apiUrl(o.url, `/v1/runner-pools/${encodeURIComponent(o.pool ?? '')}/enrollments`);
  const init: RequestInit = o.command === 'pair'
    ? {
        method: 'POST',
        headers: { 'content-type': 'application/json', 'service-version': '2026-08-27' },
        body: JSON.stringify({
          code: o.code,
          runner_enrollment: { placement: 'byoc', display_name: o.label, ...(o.pool !== undefined ? { runner_pool_id: o.pool } : {}) },
        }),
      }
    : {
        method: 'POST',
        headers: {
          'content-type': 'application/json', 'service-version': '2026-08-27', authorization: `Bearer ${o.apiKey ?? ''}`,
          'idempotency-key': `enroll-${o.label}-${Date.now()}`,
        },
        body: JSON.stringify({ machine_label: o.label }),
      };
  const shown = new URL(endpoint);
  shown.username = '';
  shown.password = '';
  let status: number;
  let text: string;
  try {
    // The whole exchange, body included, within the timeout: a server that accepts the
    // connection and never answers must not hold the command for minutes.
    const res = await (o.fetch ?? fetch)(endpoint, { ...init, signal: AbortSignal.timeout(timeoutMs) });
    status = res.status;
    text = await res.text();
  } catch (err) {
    throw requestFailure(err, `${o.command} failed`, shown.toString(), timeoutMs);
  }
  let body: IssuedBody = {};
  try {
    body = JSON.parse(text) as IssuedBody;
  } catch {
    // Not JSON: reported below as an answer without a credential.
  }
  if (status !== 201 || !body.secret || !body.runner_credential) {
    // The control plane's own error (e.g. auth.invalid_key for a used or expired code) is kept
    // under error.api_error; the CLI's error type is `api`.
    const why = body.error ? `${body.error.type}: ${body.error.message}` : status === 201 ? 'no credential in the answer' : 'no error in the answer';
    throw new CliError('api', `${o.command} failed: HTTP ${status} ${why}`, 1, { status }, { status, api_error: body.error ?? null });
  }
  return body as IssuedBody & Required<Pick<IssuedBody, 'secret' | 'runner_credential'>>;
}
