/** The role an API key or credential acts with. */
export type Role = 'root' | 'admin' | 'developer' | 'runner' | 'viewer';

/** What kind of bearer authenticated a request. */
export type CallerKind = 'api_key' | 'principal_credential' | 'runner_credential' | 'anonymous';
