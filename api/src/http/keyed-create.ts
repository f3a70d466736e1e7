import { ApiError, crashPoint, newId, type IdKind } from '@agentplane/core';
import type { UniqueKey, VersionedDoc, VersionedStore } from '@agentplane/domain';
import type { KeyedRequest } from './idempotency.js';

/**
 * Version 1 of a versioned resource (an Agent, an Environment), made once per keyed request
 * however many times the request is sent. With an Idempotency-Key the resource's id is derived
 * from the key and the request's fingerprint (`KeyedRequest.id`), so a retry whose first attempt
 * died after writing it (the key's pending record lapsed with its process) finds it under the same
 * id and answers it, 201 as the first attempt would have, instead of making a second one. A
 * resource under that id older than the key's record lifetime was made by an earlier use of the
 * key: the request is then refused as a reused key. `point` names the crash point right after the
 * write (crash tests). `unique`: the Workspace-unique key the resource claims in the same write (a
 * harness or sandbox profile's); the retry's resource holds it already, so the retry is answered,
 * not refused for the key.
 */
export async function createVersioned<T extends VersionedDoc>(
  store: VersionedStore<T>, ws: string, doc: T, kind: IdKind, keyed: KeyedRequest | undefined, point: string, unique?: UniqueKey,
): Promise<T> {
  const id = keyed ? createdId(kind, keyed) : doc.id;
  let made: T;
  try {
    made = await store.create(ws, { ...doc, id }, unique);
  } catch (err) {
    if (!keyed || !(err instanceof ApiError && err.type === 'validation.conflict')) throw err;
    // Version 1 as the first attempt answered it (later versions do not change what it said);
    // the same age rule as every keyed create's.
    const earlier = earlierAttempt(await store.getVersion(ws, id, 1).catch(() => null), keyed);
    if (earlier) return earlier;
    throw err;
  }
  crashPoint(point);
  return made;
}

/**
 * The id of a resource a create makes: with an Idempotency-Key, derived from the key and the
 * request's fingerprint (as `createVersioned` derives it), so that a retry whose first attempt
 * died after writing finds what that attempt wrote (`earlierAttempt`); else a new one.
 */
export function createdId(kind: IdKind, keyed: KeyedRequest | undefined): string {
  return keyed ? keyed.id(kind, keyed.fingerprint) : newId(kind);
}

/**
 * What an earlier attempt of this keyed create wrote under its derived id (`createdId`), when it
 * answers this request: found, made within the key's record lifetime and unchanged since. Null
 * when nothing is there (create it). A resource made longer ago was made by an earlier use of the
 * key, and one changed since is no longer what the first attempt would have answered: the request
 * is refused as a reused key (409 `idempotency.conflict`), nothing written. `unchanged`: whether
 * the resource is still as the first attempt made it; by default, still at version 1 (a resource
 * whose own processing moves it on, or whose changes live beside its head, says otherwise).
 */
export function earlierAttempt<T extends { created_at: string; version: number }>(
  found: T | null, keyed: KeyedRequest, unchanged: (found: T) => boolean = (f) => f.version === 1,
): T | null {
  if (found === null) return null;
  if (unchanged(found) && Date.parse(found.created_at) + keyed.keptMs > Date.now()) return found;
  throw new ApiError('idempotency.conflict', 'this Idempotency-Key was used for this request before, and what it made has changed or is older than keys are kept; use a new key');
}

/**
 * The id a create makes its resource under (`createdId`) and what an earlier attempt of the same
 * keyed request wrote there, when it answers this one (`earlierAttempt`: null when nothing is
 * there, 409 `idempotency.conflict` when it changed since or is older than keys are kept). Without
 * a key, a new id and nothing earlier (no read). For a create whose retry answers more than the
 * found resource (a new first secret in place of the one its first attempt never showed).
 */
export async function priorAttempt<T extends { created_at: string; version: number }>(
  kind: IdKind, keyed: KeyedRequest | undefined, find: (id: string) => Promise<T | null>,
): Promise<{ id: string; earlier: T | null }> {
  const id = createdId(kind, keyed);
  return { id, earlier: keyed ? earlierAttempt(await find(id), keyed) : null };
}

/**
 * A create whose resource is written in one step, made once per keyed request however many times
 * the request is sent: what an earlier attempt wrote answered (`priorAttempt`), else `make(id)`.
 * `point` names the crash point right after the write (crash tests), unless `make` names its own.
 */
export async function createOnce<T extends { created_at: string; version: number }>(
  kind: IdKind, keyed: KeyedRequest | undefined, find: (id: string) => Promise<T | null>, make: (id: string) => Promise<T>, point?: string,
): Promise<T> {
  const { id, earlier } = await priorAttempt(kind, keyed, find);
  if (earlier) return earlier;
  const made = await make(id);
  if (point !== undefined) crashPoint(point);
  return made;
}
