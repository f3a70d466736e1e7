import type { ServerResponse } from 'node:http';
import { pipeline } from 'node:stream/promises';
import { Readable } from 'node:stream';
import { Id, nowIso, Obj, Page, PageQuery, Type } from '@agentplane/core';
import { READERS, WRITERS } from '../http/caller.js';
import { defineOperation, type Operation, type UploadBody } from '../http/operation.js';
import { pageOf, workspaceRead, workspaceWrite } from '../http/workspace-operation.js';
import { requireWorkspace } from '../http/workspace-scope.js';
import { FILE_LIMITS, FileSchema, publicFile, type FileDoc } from '@agentplane/domain';
import { receiveFileUpload, type StagedUpload } from './upload.js';

const FilePath = Obj({ file_id: Id('file') });
const readers = { kind: 'bearer', roles: READERS } as const;
const writers = { kind: 'bearer', roles: WRITERS } as const;

const fileUpload: UploadBody = {
  contentType: 'multipart/form-data',
  schema: Obj({ file: Type.String({ contentEncoding: 'binary', description: `the file, at most ${FILE_LIMITS.maxContentBytes} bytes` }) }),
  receive: async (stream, deps) => ({ ...(await receiveFileUpload(stream, deps.files)) }),
  // A retry with the same key must carry the same bytes under the same name and type.
  fingerprint: (b) => ({ filename: b.filename, content_type: b.content_type, size_bytes: b.size_bytes, sha256: b.sha256 }),
  discard: (b, deps) => deps.files.discard(b.file_id as string),
};

/**
 * Files: immutable uploaded content in a Workspace, used as Session `file` resources. Upload
 * is `multipart/form-data` with one part named `file` (64 MiB of content plus 64 KiB of
 * framing; past either, 413 while the body streams in). docs/FILES.md has the design.
 */
export const fileOperations: Operation[] = [
  workspaceWrite('POST', {
    operationId: 'files.uploadFile', path: '/v1/files',
    audit: { target: 'response' },
    summary: 'Upload a File (multipart/form-data, one part named `file`)', auth: writers, upload: fileUpload,
    response: FileSchema, successStatus: 201, idempotency: 'optional', mcp: 'never',
  }, async (ws, { body, deps, keyed }) => {
    const staged = body as unknown as StagedUpload;
    const now = nowIso();
    const file: FileDoc = {
      id: staged.file_id, type: 'file', workspace_id: ws, filename: staged.filename, content_type: staged.content_type,
      size_bytes: staged.size_bytes, sha256: staged.sha256, version: 1, created_at: now, updated_at: now,
    };
    // A StorageError here reaches the error boundary: 500 `runtime.internal` with an incident reference.
    // Committed once per keyed request (its fingerprint holds the content's digest, size, name and
    // type): the retry of one whose first attempt died after committing (crash point
    // `file-committed`), its key's pending record lapsed, is answered that File (201, the same id),
    // its own staged content dropped, not stored again as a second File.
    return publicFile(await deps.files.commit(file, keyed?.write('file')));
  }),
  workspaceRead({
    operationId: 'files.listFiles', path: '/v1/files', summary: 'List Files, newest first', auth: readers,
    query: PageQuery({}), response: Page(FileSchema), mcp: 'full',
  }, async (ws, { query, deps }) => {
    const page = await deps.files.list(ws, pageOf(query));
    return { data: page.data.map(publicFile), next_page: page.next_page };
  }),
  workspaceRead({
    operationId: 'files.getFile', path: '/v1/files/{file_id}', summary: 'Read a File head (no content)',
    auth: readers, params: FilePath, response: FileSchema, mcp: 'full',
  }, async (ws, { params, deps }) => publicFile(await deps.files.get(ws, params.file_id))),
  defineOperation({
    operationId: 'files.downloadFile', method: 'GET', path: '/v1/files/{file_id}/content', summary: 'Download the content of a File',
    auth: readers, params: FilePath, mcp: 'never',
    async handler({ caller, params, deps }) {
      const file = await deps.files.get(requireWorkspace(caller), params.file_id);
      return { kind: 'stream', write: (res, signal) => sendFileContent(res, file, deps.files.read(file), signal) };
    },
  }),
  workspaceWrite('DELETE', {
    operationId: 'files.deleteFile', path: '/v1/files/{file_id}',
    audit: { target: 'file_id' },
    summary: 'Delete a File; Sessions that name it can no longer materialise it', auth: writers, params: FilePath,
    response: Obj({ id: Id('file'), type: Type.Literal('file_deleted') }), mcp: 'full',
  }, async (ws, { params, deps }) => {
    await deps.files.remove(ws, params.file_id);
    return { id: params.file_id, type: 'file_deleted' };
  }),
];

/**
 * A value for `filename*` (RFC 8187 `value-chars`): UTF-8, percent-encoded except `attr-char`.
 * `encodeURIComponent` leaves `'`, `(`, `)` and `*` as they are, which `attr-char` does not allow
 * (`'` even delimits the charset and language), so they are escaped too.
 */
export function rfc8187(value: string): string {
  return encodeURIComponent(value).replace(/['()*]/g, (c) => `%${c.charCodeAt(0).toString(16).toUpperCase()}`);
}

/**
 * Writes a File as an attachment. The content type is the uploaded one, but `nosniff` and
 * `attachment` keep a browser from rendering it; the ETag is the content digest.
 */
export async function sendFileContent(res: ServerResponse, file: FileDoc, content: AsyncIterable<Buffer>, signal: AbortSignal): Promise<void> {
  res.writeHead(200, {
    'Content-Type': file.content_type,
    'Content-Length': String(file.size_bytes),
    'Content-Disposition': `attachment; filename*=UTF-8''${rfc8187(file.filename)}`,
    'X-Content-Type-Options': 'nosniff',
    ETag: `"${file.sha256}"`,
    'Cache-Control': 'private, max-age=0',
  });
  try {
    await pipeline(Readable.from(content), res, { signal });
  } catch {
    // The client went away, or a chunk was missing: the short body tells the client (Content-Length).
    res.destroy();
  }
}
