import { ApiError } from '@agentplane/core';
import { META } from '../a2a/task-index.js';

/** The metadata key naming the AutomationFiring that created a Session (automations/service.ts). */
export const AUTOMATION_FIRING_KEY = 'automation_firing_id';

/**
 * Metadata keys the platform writes on the Sessions it creates, and reads as facts: whose A2A
 * task a Session is (the A2A edge answers a Principal for its own tasks only) and which firing
 * made it (webhook events and a firing's retry name it). A client does not write them: a create
 * or update naming one is 400, and an update's replacement of the metadata keeps them.
 */
export const PLATFORM_METADATA_KEYS: ReadonlySet<string> = new Set([META.installation, META.scope, META.principal, AUTOMATION_FIRING_KEY]);

/** 400 `validation.malformed` when a client's metadata names a key the platform keeps. */
export function refusePlatformMetadata(metadata: Readonly<Record<string, string>> | undefined): void {
  if (metadata === undefined) return;
  for (const key of Object.keys(metadata)) {
    if (PLATFORM_METADATA_KEYS.has(key)) throw new ApiError('validation.malformed', `body.metadata: '${key}' is written by the platform only`);
  }
}

/** A client's replacement metadata, with the platform's keys of the current metadata kept. */
export function replacedMetadata(next: Readonly<Record<string, string>>, current: Readonly<Record<string, string>>): Record<string, string> {
  const kept: Record<string, string> = { ...next };
  for (const [key, value] of Object.entries(current)) if (PLATFORM_METADATA_KEYS.has(key)) kept[key] = value;
  return kept;
}
