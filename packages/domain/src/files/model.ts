import { DIGEST_PATTERN, Id, Obj, Timestamp, Type } from '@agentplane/core';
import type { StoredDoc } from '@agentplane/store';

/** Upload ceiling of `POST /v1/files`: 64 MiB of file content plus 64 KiB of multipart framing. */
export const FILE_LIMITS = Object.freeze({
  maxContentBytes: 64 * 1024 * 1024,
  maxFramingBytes: 64 * 1024,
  maxFilenameChars: 255,
});

/** An uploaded File: immutable content, addressed by id, readable in its Workspace only. */
export interface FileDoc extends StoredDoc {
  type: 'file';
  workspace_id: string;
  filename: string;
  content_type: string;
  size_bytes: number;
  /** Content digest, `sha256:<hex>`. */
  sha256: string;
  /** The Session whose tool produced it (a browser screenshot); absent on uploaded Files. */
  session_id?: string;
}

export const FileSchema = Obj({
  id: Id('file'),
  type: Type.Literal('file'),
  workspace_id: Id('workspace'),
  filename: Type.String({ minLength: 1, maxLength: FILE_LIMITS.maxFilenameChars }),
  content_type: Type.String({ minLength: 1, maxLength: 255 }),
  size_bytes: Type.Integer({ minimum: 0 }),
  sha256: Type.String({ pattern: DIGEST_PATTERN }),
  session_id: Type.Optional(Id('session')),
  version: Type.Integer({ minimum: 1 }),
  created_at: Timestamp(),
  updated_at: Timestamp(),
});

export function publicFile(f: FileDoc): FileDoc {
  return { ...f };
}
