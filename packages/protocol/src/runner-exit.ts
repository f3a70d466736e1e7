/**
 * The runner CLI's exit codes besides 0 (success) and 1 (every failure not listed): a contract
 * with what starts the runner (`agentplane-runner --help` lists them). `credentialRefused`:
 * `start` stopped because the control plane refused the runner credential for good (revoked,
 * deleted); a supervisor must not restart the daemon on it (the systemd unit's
 * RestartPreventExitStatus=, the platform's local runner).
 */
export const RUNNER_EXIT = { usage: 2, config: 2, alreadyRunning: 3, dockerUnavailable: 4, credentialRefused: 5 } as const;
