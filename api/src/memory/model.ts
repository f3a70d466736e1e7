import { ApiError, Id, Metadata, Nullable, Obj, Timestamp, Type } from '@agentplane/core';
import type { StoredDoc } from '@agentplane/store';

/** Ceilings of MemoryStores (docs/MEMORY.md). */
export const MEMORY_LIMITS = Object.freeze({
  /** The contract's "MemoryStore document body": UTF-8 bytes of `content`. */
  maxContentBytes: 100_000,
  maxPathChars: 512,
  maxQueryChars: 1_000,
});

/** A MemoryStore head: a Workspace document (`{w:<ws>}:doc:<memstore_id>`). */
export interface MemoryStoreDoc extends StoredDoc {
  type: 'memory_store';
  workspace_id: string;
  name: string;
  description: string | null;
  metadata: Record<string, string>;
}

/** Who wrote a document version: an API credential, or a Run through the harness's memory tools. */
export type MemoryAuthor =
  | { kind: 'api_key' | 'principal_credential'; id: string; principal_id: string | null }
  | { kind: 'run'; id: string; session_id: string };

/** One version of one document, as stored (the current one in `:docs`, every one in its history list). */
export interface MemoryDocument {
  type: 'memory_document';
  memory_store_id: string;
  path: string;
  content: string;
  metadata: Record<string, string>;
  size_bytes: number;
  version: number;
  created_at: string;
  updated_at: string;
  updated_by: MemoryAuthor;
}

/** What a listing shows of a document: everything but its content. */
export type MemoryDocumentEntry = Pick<MemoryDocument, 'path' | 'version' | 'size_bytes' | 'metadata' | 'updated_at'>;

/** A history entry: a version of the document, or the marker of its deletion. */
export type MemoryVersion = MemoryDocument | (Omit<MemoryDocument, 'type' | 'content' | 'metadata' | 'size_bytes'> & { type: 'memory_document_deleted' });

const Author = Type.Union([
  Obj({ kind: Type.Union([Type.Literal('api_key'), Type.Literal('principal_credential')]), id: Type.String(), principal_id: Nullable(Id('principal')) }),
  Obj({ kind: Type.Literal('run'), id: Id('run'), session_id: Id('session') }),
]);

export const MemoryStoreSchema = Obj({
  id: Id('memoryStore'),
  type: Type.Literal('memory_store'),
  workspace_id: Id('workspace'),
  name: Type.String({ minLength: 1, maxLength: 200 }),
  description: Nullable(Type.String({ maxLength: 2000 })),
  metadata: Metadata(),
  document_count: Type.Integer({ minimum: 0 }),
  version: Type.Integer({ minimum: 1 }),
  created_at: Timestamp(),
  updated_at: Timestamp(),
});

/** Path-like key: `notes/2026/plan.md`; no leading or trailing `/`, no empty, `.` or `..` segment, no control character. */
export const MemoryPath = () => Type.String({ minLength: 1, maxLength: MEMORY_LIMITS.maxPathChars, pattern: '^[^/\\u0000-\\u001f\\u007f](?:[^\\u0000-\\u001f\\u007f]*[^/\\u0000-\\u001f\\u007f])?$' });

export const MemoryDocumentSchema = Obj({
  type: Type.Literal('memory_document'),
  memory_store_id: Id('memoryStore'),
  path: MemoryPath(),
  content: Type.String(),
  metadata: Metadata(),
  size_bytes: Type.Integer({ minimum: 0 }),
  version: Type.Integer({ minimum: 1 }),
  created_at: Timestamp(),
  updated_at: Timestamp(),
  updated_by: Author,
});

export const MemoryVersionSchema = Type.Union([
  MemoryDocumentSchema,
  Obj({
    type: Type.Literal('memory_document_deleted'), memory_store_id: Id('memoryStore'), path: MemoryPath(), version: Type.Integer({ minimum: 1 }),
    created_at: Timestamp(), updated_at: Timestamp(), updated_by: Author,
  }),
]);

/** A listing entry: the document without its content. */
export const MemoryDocumentEntrySchema = Obj({
  path: MemoryPath(), version: Type.Integer({ minimum: 1 }), size_bytes: Type.Integer({ minimum: 0 }), metadata: Metadata(), updated_at: Timestamp(),
});

export const MemorySearchResultSchema = Obj({
  path: MemoryPath(), score: Type.Number(), version: Type.Integer({ minimum: 1 }), metadata: Metadata(), updated_at: Timestamp(),
  /** Up to 240 characters of the content around the first matching term. */
  snippet: Type.String(),
});

/**
 * 400 for a string that is not well-formed UTF-16 (a lone surrogate, which JSON's `\ud800` can
 * carry): Redis keeps UTF-8, where it would become U+FFFD and collide with that character.
 */
export function checkWellFormed(value: string, field: string): void {
  if (!(value as string & { isWellFormed(): boolean }).isWellFormed()) {
    throw new ApiError('validation.malformed', `${field}: not well-formed Unicode (a lone surrogate)`);
  }
}

/** Metadata keys and values: well-formed strings (the schema checks their count and lengths). */
export function checkMetadata(metadata: Record<string, string> | undefined, field = 'metadata'): void {
  for (const [k, v] of Object.entries(metadata ?? {})) {
    checkWellFormed(k, `${field} key`);
    checkWellFormed(v, `${field}.${k}`);
  }
}

/** The schema's pattern admits `a/./b` and `..`; segments (and well-formedness) are checked here. */
export function checkPath(path: string, field = 'path'): void {
  checkWellFormed(path, field);
  if (path.split('/').some((s) => s === '' || s === '.' || s === '..')) {
    throw new ApiError('validation.malformed', `${field}: a path has no empty, '.' or '..' segment`);
  }
}

export function checkContent(content: string, field = 'content'): number {
  checkWellFormed(content, field);
  const bytes = Buffer.byteLength(content, 'utf8');
  if (bytes > MEMORY_LIMITS.maxContentBytes) {
    throw new ApiError('validation.malformed', `${field}: ${bytes} bytes; a memory document holds at most ${MEMORY_LIMITS.maxContentBytes} bytes (100 kB)`);
  }
  return bytes;
}
