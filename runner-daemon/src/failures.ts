/**
 * A failure of the machinery, not of the agent's work (a control plane that did not answer, a
 * git host that timed out): the lease fails as `infrastructure`, so the Run is retried,
 * possibly elsewhere. Any other error fails the lease as `work`, which ends the turn with its
 * message.
 */
export class InfrastructureFailure extends Error {
  constructor(message: string, options?: { cause?: unknown }) {
    super(message, options);
    this.name = 'InfrastructureFailure';
  }
}
