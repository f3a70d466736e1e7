export { SANDBOX_LABELS, SANDBOX_SCOPE_ENV, attributionLabels, canaryLabels, type SandboxAttribution } from './labels.js';
export { dockerAvailable, dockerClient } from './docker.js';
export { probeCredential, type CredentialProbe } from './probe.js';
export { surveyManaged, planReap, reapItems, SandboxReaper, type ManagedItem, type PlanOptions, type ReapPlan, type ReapResult, type RunnerJudgement, type RunnerVerdict, type SandboxReaperOptions, type SurveyOptions } from './reaper.js';
