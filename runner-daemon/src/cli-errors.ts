/**
 * How the runner CLI's commands fail: each failure has a `--json` error type and an exit code
 * (`RUNNER_EXIT` of `@agentplane/protocol`; `agentplane-runner --help` lists them).
 */
import { ConfigError } from '@agentplane/core';
import { RUNNER_EXIT, type CredentialRefusal, type RunnerCredentialFile } from '@agentplane/protocol';
import { DaemonRunningError } from './lock.js';

export type ErrorType =
  | 'usage' | 'config' | 'network' | 'api' | 'not_running' | 'already_running' | 'docker_unavailable' | 'credential_refused' | 'internal';

/** A mistake in how the command was called: exit code 2, with the command's usage. */
export class UsageError extends Error {
  constructor(message: string, readonly showUsage = true) {
    super(message);
  }
}

/**
 * A failure with its own `--json` error type and exit code; `fields` go next to `error` in the
 * JSON answer, `detail` into it.
 */
export class CliError extends Error {
  constructor(
    readonly type: ErrorType, message: string, readonly exitCode: number,
    readonly fields: Record<string, unknown> = {}, readonly detail: Record<string, unknown> = {},
  ) {
    super(message);
  }
}

/**
 * Errors of the local filesystem (disk full, read-only, no permission, a path that is not a
 * directory): the machine's configuration, not the network.
 */
const FS_ERRNOS = new Set(['ENOSPC', 'EDQUOT', 'EROFS', 'EACCES', 'EPERM', 'ENOENT', 'ENOTDIR', 'EISDIR']);

export const errnoOf = (err: unknown): string | undefined => {
  const code = (err as { code?: unknown } | null)?.code;
  return typeof code === 'string' ? code : undefined;
};

export const isFsError = (err: unknown): boolean => FS_ERRNOS.has(errnoOf(err) ?? '');

/** TLS verification failures a private CA explains (NODE_EXTRA_CA_CERTS fixes them). */
const UNTRUSTED_CERT = new Set([
  'DEPTH_ZERO_SELF_SIGNED_CERT', 'SELF_SIGNED_CERT_IN_CHAIN', 'UNABLE_TO_VERIFY_LEAF_SIGNATURE', 'UNABLE_TO_GET_ISSUER_CERT',
  'UNABLE_TO_GET_ISSUER_CERT_LOCALLY',
]);

/**
 * Why a request to the control plane got no answer, as a `network` error naming the URL: no
 * answer in time, a certificate this machine does not trust (with the fix), a refused
 * connection, an unknown host.
 */
export function requestFailure(err: unknown, what: string, url: string, timeoutMs: number): CliError {
  const name = (err as { name?: unknown } | null)?.name;
  if (name === 'TimeoutError' || name === 'AbortError') {
    return new CliError('network', `${what}: no answer from ${url} within ${timeoutMs / 1000} s (something accepted the connection but did not answer: ` +
      'a proxy or firewall in the way, or a control plane that is stuck; --timeout waits longer)', 1, {}, { url, cause: 'timeout' });
  }
  const cause = (err as { cause?: { code?: unknown; message?: unknown } } | null)?.cause;
  const code = typeof cause?.code === 'string' ? cause.code : errnoOf(err);
  const text = typeof cause?.message === 'string' ? cause.message : err instanceof Error ? err.message : String(err);
  const detail = { url, cause: code ?? null };
  if (code && UNTRUSTED_CERT.has(code)) {
    return new CliError('network', `${what}: the TLS certificate of ${url} is not trusted by this machine (${code}). If the control plane's ` +
      'certificate is issued by a private CA, give its PEM file to the runner: NODE_EXTRA_CA_CERTS=<ca.pem> agentplane-runner …', 1, {}, detail);
  }
  if (code === 'CERT_HAS_EXPIRED') return new CliError('network', `${what}: the TLS certificate of ${url} has expired (${code})`, 1, {}, detail);
  if (code === 'ERR_TLS_CERT_ALTNAME_INVALID') return new CliError('network', `${what}: the TLS certificate of ${url} is not for that host name (${code})`, 1, {}, detail);
  if (code === 'ECONNREFUSED') return new CliError('network', `${what}: ${url} refused the connection (ECONNREFUSED): is the control plane running at that address?`, 1, {}, detail);
  if (code === 'ENOTFOUND' || code === 'EAI_AGAIN') return new CliError('network', `${what}: the host of ${url} cannot be resolved (${code})`, 1, {}, detail);
  return new CliError('network', `${what}: cannot reach ${url}: ${code ?? text}`, 1, {}, detail);
}

/**
 * `start` stopped because the control plane refused the runner credential for good: one line
 * naming the control plane, the runner, the control plane's words and what to do (pair again),
 * exit code 5.
 */
export function credentialRefused(refusal: CredentialRefusal, cred: RunnerCredentialFile, configDir: string): CliError {
  const why = refusal.http_status === 401
    ? 'it was revoked or deleted'
    : 'it is not allowed to connect (its owner Principal, Workspace or Organization is not active, or it is not a runner credential)';
  const words = refusal.error_message ? `: ${refusal.error_message}` : '';
  return new CliError(
    'credential_refused',
    `the control plane at ${cred.base_url} refused the credential of runner ${cred.runner_id} (HTTP ${refusal.http_status}${words}) twice in a row: ` +
      `${why}. Pair this machine again with a new pairing code: agentplane-runner pair --force --code <code> --url ${cred.base_url} ` +
      `--config-dir ${configDir} (a managed pool's runner: enroll --force)`,
    RUNNER_EXIT.credentialRefused,
    {},
    {
      http_status: refusal.http_status, api_error: refusal.error_type ? { type: refusal.error_type, message: refusal.error_message } : null,
      runner_id: cred.runner_id, runner_credential_id: cred.runner_credential_id, url: cred.base_url,
    },
  );
}

export interface Classified {
  type: ErrorType;
  message: string;
  code: number;
  fields?: Record<string, unknown>;
  detail?: Record<string, unknown>;
}

/**
 * Why a command failed, for `--json`: `usage` and `config` exit 2, `already_running` 3,
 * `docker_unavailable` 4, `credential_refused` 5, `network`, `api`, `not_running` and `internal`
 * exit 1.
 */
export function classify(err: unknown): Classified {
  const message = err instanceof Error ? err.message : String(err);
  if (err instanceof CliError) return { type: err.type, message, code: err.exitCode, fields: err.fields, detail: err.detail };
  if (err instanceof DaemonRunningError) return { type: 'already_running', message, code: RUNNER_EXIT.alreadyRunning, fields: { pid: err.holder.pid } };
  if (err instanceof UsageError) return { type: 'usage', message, code: RUNNER_EXIT.usage };
  if (err instanceof ConfigError) return { type: 'config', message, code: RUNNER_EXIT.config };
  // Disk full, read-only, not a directory: this machine's configuration.
  if (isFsError(err)) return { type: 'config', message, code: RUNNER_EXIT.config, detail: { code: errnoOf(err) } };
  // fetch() rejects with a TypeError whose cause carries the socket error (ECONNREFUSED, ENOTFOUND, …).
  const cause = (err as { cause?: { code?: string; message?: string } } | null)?.cause;
  if (err instanceof TypeError && cause) return { type: 'network', message: `${message}: ${cause.code ?? cause.message ?? 'network error'}`, code: 1 };
  if (/^E[A-Z]+/.test(errnoOf(err) ?? '')) return { type: 'network', message, code: 1 };
  return { type: 'internal', message, code: 1 };
}
