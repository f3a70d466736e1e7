import { ApiError, crashPoint, type IdKind } from '@agentplane/core';
import type { VersionedDoc, VersionedStore } from '@agentplane/domain';
import type { KeyedRequest } from './idempotency.js';

/**
 * Version 1 of a versioned resource (an Agent, an Environment), made once per keyed request
 * however many times the request is sent. With an Idempotency-Key the resource's id is derived
 * from the key and the request's fingerprint (`KeyedRequest.id`), so a retry whose first attempt
 * died after writing it (the key's pending record lapsed with its process) finds it under the same
 * id and answers it, 201 as the first attempt would have, instead of making a second one. A
 * resource under that id older than the key's record lifetime was made by an earlier use of the
 * key: the request is then refused as a reused key. `point` names the crash point right after the
 * write (crash tests).
 */
export async function createVersioned<T extends VersionedDoc>(
  store: VersionedStore<T>, ws: string, doc: T, kind: IdKind, keyed: KeyedRequest | undefined, point: string,
): Promise<T> {
  const id = keyed ? keyed.id(kind, keyed.fingerprint) : doc.id;
  let made: T;
  try {
    made = await store.create(ws, { ...doc, id });
  } catch (err) {
    if (!keyed || !(err instanceof ApiError && err.type === 'validation.conflict')) throw err;
    const earlier = await store.getVersion(ws, id, 1).catch(() => null);
    if (earlier && Date.parse(earlier.created_at) + keyed.keptMs > Date.now()) return earlier;
    throw new ApiError('idempotency.conflict', 'this Idempotency-Key was used for this request longer ago than keys are kept; use a new key');
  }
  crashPoint(point);
  return made;
}
