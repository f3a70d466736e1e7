import { ApiError, Id, Obj, Timestamp, Type } from '@agentplane/core';
import type { StoredDoc } from '@agentplane/store';
import { checkWellFormed } from '../memory/model.js';

const MiB = 1024 * 1024;

/** The contract's Project limits, and the JSON envelope derived from them (docs/MEMORY.md, "Projects"). */
export const PROJECT_LIMITS = Object.freeze({
  maxFiles: 1024,
  maxFileBytes: 10 * MiB,
  maxRevisionBytes: 20 * MiB,
  maxPushFiles: 64,
  maxPathChars: 1024,
  /** Longest name of one file or directory, in UTF-8 bytes: what a file system holds (NAME_MAX). */
  maxSegmentBytes: 255,
});

/**
 * Largest JSON body of the tree routes: the revision budget in base64, plus, for every file the
 * count allows, the longest path written entirely as `\uXXXX` escapes and the member names and
 * punctuation of one entry, plus 64 KiB for the rest of the body. Past it: 413 while streaming.
 */
export const PROJECT_ENVELOPE_BYTES = Math.ceil(PROJECT_LIMITS.maxRevisionBytes / 3) * 4
  + PROJECT_LIMITS.maxFiles * (PROJECT_LIMITS.maxPathChars * 6 + 128)
  + 64 * 1024;

export interface ProjectDoc extends StoredDoc {
  type: 'project';
  workspace_id: string;
  name: string;
}

export interface ManifestEntry {
  path: string;
  size_bytes: number;
  sha256: string;
  executable: boolean;
}

/** One immutable revision: the complete tree, by content digest. */
export interface ProjectRevision {
  type: 'project_revision';
  project_id: string;
  revision_number: number;
  /** `create`, `revision` (a complete tree) or `push` (changes on a base revision). */
  source: 'create' | 'revision' | 'push';
  base_revision_number: number | null;
  files: ManifestEntry[];
  file_count: number;
  total_bytes: number;
  created_at: string;
}

export const ProjectPath = () => Type.String({ minLength: 1, maxLength: PROJECT_LIMITS.maxPathChars });

export const TreeFile = Obj({
  path: ProjectPath(),
  content_base64: Type.String(),
  executable: Type.Optional(Type.Boolean()),
});

const Entry = Obj({ path: ProjectPath(), size_bytes: Type.Integer({ minimum: 0 }), sha256: Type.String(), executable: Type.Boolean() });

export const RevisionSchema = Obj({
  type: Type.Literal('project_revision'),
  project_id: Id('project'),
  revision_number: Type.Integer({ minimum: 1 }),
  source: Type.Union([Type.Literal('create'), Type.Literal('revision'), Type.Literal('push')]),
  base_revision_number: Type.Union([Type.Integer({ minimum: 1 }), Type.Null()]),
  files: Type.Array(Entry),
  file_count: Type.Integer({ minimum: 0 }),
  total_bytes: Type.Integer({ minimum: 0 }),
  created_at: Timestamp(),
});

export const ProjectSchema = Obj({
  id: Id('project'),
  type: Type.Literal('project'),
  workspace_id: Id('workspace'),
  name: Type.String({ minLength: 1, maxLength: 200 }),
  latest_revision_number: Type.Integer({ minimum: 1 }),
  latest_revision: Type.Optional(RevisionSchema),
  version: Type.Integer({ minimum: 1 }),
  created_at: Timestamp(),
  updated_at: Timestamp(),
});

/**
 * A relative path inside the tree: no leading `/`, no empty, `.` or `..` segment, no control
 * character or backslash, well-formed Unicode (a lone surrogate would become U+FFFD on disk), and
 * no segment longer than a file system's name limit (the tree is mounted as files in a sandbox).
 */
export function checkProjectPath(path: string, field: string): void {
  checkWellFormed(path, field);
  const segments = path.split('/');
  if (path.startsWith('/') || /[\0-\x1f\x7f\\]/.test(path) || segments.some((s) => s === '' || s === '.' || s === '..')) {
    throw new ApiError('validation.malformed', `${field}: '${path.slice(0, 80)}' is not a relative path (no leading '/', empty, '.' or '..' segment, backslash or control character)`);
  }
  const long = segments.find((s) => Buffer.byteLength(s, 'utf8') > PROJECT_LIMITS.maxSegmentBytes);
  if (long !== undefined) {
    throw new ApiError('validation.malformed', `${field}: '${long.slice(0, 80)}…' is ${Buffer.byteLength(long, 'utf8')} bytes of UTF-8; a file or directory name is at most ${PROJECT_LIMITS.maxSegmentBytes}`);
  }
}

const BASE64 = /^[A-Za-z0-9+/]*={0,2}$/;

/** Decodes one file's content; 400 for invalid base64 or a file over 10 MiB. */
export function decodeContent(b64: string, field: string): Buffer {
  if (b64.length % 4 !== 0 || !BASE64.test(b64)) throw new ApiError('validation.malformed', `${field}: not valid base64`);
  // Decoded size before decoding: a file over the limit is refused without allocating it.
  const size = (b64.length / 4) * 3 - (b64.endsWith('==') ? 2 : b64.endsWith('=') ? 1 : 0);
  if (size > PROJECT_LIMITS.maxFileBytes) {
    throw new ApiError('validation.malformed', `${field}: ${size} bytes decoded; a project file holds at most ${PROJECT_LIMITS.maxFileBytes} bytes (10 MiB)`);
  }
  return Buffer.from(b64, 'base64');
}
