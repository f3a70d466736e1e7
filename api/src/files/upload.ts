import type { IncomingMessage } from 'node:http';
import type { Readable } from 'node:stream';
import busboy from 'busboy';
import { ApiError, newId } from '@agentplane/core';
import { drainRequest } from '../http/body.js';
import { FILE_LIMITS } from '@agentplane/domain';
import { ContentTooLarge, StorageError, type FileStore } from '@agentplane/domain';

/** An upload staged in the store: bytes in, digest known, File head not created yet. */
export interface StagedUpload {
  file_id: string;
  filename: string;
  content_type: string;
  size_bytes: number;
  sha256: string;
}

const MULTIPART = /^multipart\/form-data\b/i;

function tooLarge(what: string, limit: number): ApiError {
  return new ApiError('validation.payload_too_large', `${what} exceeds the limit of ${limit} bytes`);
}

/** A display name from the part's filename: no directories, no control characters, bounded. */
export function cleanFilename(raw: string | undefined): string {
  const base = (raw ?? '').split(/[\\/]/).pop() ?? '';
  const clean = base.replace(/[\u0000-\u001f\u007f]/g, '').trim();
  if (clean.length === 0 || clean === '.' || clean === '..') {
    throw new ApiError('validation.malformed', 'multipart: the file part needs a filename');
  }
  if (clean.length > FILE_LIMITS.maxFilenameChars) {
    throw new ApiError('validation.malformed', `multipart: the filename is longer than ${FILE_LIMITS.maxFilenameChars} characters`);
  }
  return clean;
}

/**
 * Reads a `multipart/form-data` body with exactly one part, a file named `file`, streaming its
 * bytes into the store as they arrive. Limits are enforced while the body streams in: file
 * content over 64 MiB, or the whole body over 64 MiB + 64 KiB of framing, is a 413 at the
 * byte that crosses it. Anything else in the body (other fields, a second file) is a 400.
 */
export function receiveFileUpload(req: IncomingMessage, store: FileStore): Promise<StagedUpload> {
  const maxBody = FILE_LIMITS.maxContentBytes + FILE_LIMITS.maxFramingBytes;
  const type = req.headers['content-type'] ?? '';
  const declared = req.headers['content-length'];
  return new Promise<StagedUpload>((resolve, reject) => {
    let settled = false;
    let staged: Promise<StagedUpload> | null = null;
    let fileStream: Readable | null = null;
    let received = 0;

    /** A StorageError is ours, not the client's: it goes on to the 500 `runtime.internal` of the error boundary. */
    const fail = (err: ApiError | StorageError) => {
      if (settled) return;
      settled = true;
      req.unpipe();
      drainRequest(req);
      // Stop the part being stored, then drop whatever it staged, then answer.
      if (fileStream && !fileStream.destroyed) fileStream.destroy();
      const cleanup = staged ? staged.then((u) => store.discard(u.file_id), () => undefined) : Promise.resolve();
      void cleanup.catch(() => undefined).then(() => reject(err));
    };

    if (!MULTIPART.test(type)) {
      return fail(new ApiError('validation.malformed', 'POST /v1/files takes multipart/form-data with one part named `file`'));
    }
    if (declared !== undefined && Number(declared) > maxBody) {
      return fail(tooLarge('the upload', maxBody));
    }
    let bb: busboy.Busboy;
    try {
      bb = busboy({
        headers: req.headers,
        // Header parameters (the part's filename) are UTF-8, as browsers and fetch send them, not
        // busboy's default latin1. An RFC 5987 `filename*` carries its own charset and wins.
        defParamCharset: 'utf8',
        limits: { files: 1, fields: 0, fileSize: FILE_LIMITS.maxContentBytes + 1, headerPairs: 16 },
      });
    } catch (err) {
      return fail(new ApiError('validation.malformed', `multipart: ${err instanceof Error ? err.message : 'unreadable content type'}`));
    }

    bb.on('file', (name, stream, info) => {
      if (name !== 'file') {
        stream.resume();
        return fail(new ApiError('validation.malformed', `multipart: unknown part '${name}'; the only part is 'file'`));
      }
      let filename: string;
      try {
        filename = cleanFilename(info.filename);
      } catch (err) {
        stream.resume();
        return fail(err as ApiError);
      }
      // RFC 7578: a part without a usable type is text/plain (what the parser itself falls back to).
      const contentType = /^[\w.+-]+\/[\w.+-]+$/.test(info.mimeType) && info.mimeType.length <= 255 ? info.mimeType.toLowerCase() : 'text/plain';
      const id = newId('file');
      fileStream = stream;
      staged = store.stage(id, stream as AsyncIterable<Buffer>, FILE_LIMITS.maxContentBytes).then(
        (r) => ({ file_id: id, filename, content_type: contentType, size_bytes: r.size_bytes, sha256: r.sha256 }),
      );
      staged.catch((err: unknown) => {
        stream.resume();
        fail(
          err instanceof ContentTooLarge ? tooLarge('the file content', err.limit)
            : err instanceof StorageError ? err
              : new ApiError('validation.malformed', `multipart: the file part could not be read (${err instanceof Error ? err.message : 'unreadable'})`),
        );
      });
    });
    bb.on('field', (name) => fail(new ApiError('validation.malformed', `multipart: unknown field '${name}'; the only part is 'file'`)));
    // A part without a readable filename (none, an empty one, or an `filename*` that is not RFC 5987)
    // is a field to the parser.
    bb.on('fieldsLimit', () => fail(new ApiError('validation.malformed', "multipart: a part without a readable filename (none, empty, or a malformed filename*) is a field, and fields are not accepted; the only part is 'file', with a filename")));
    bb.on('filesLimit', () => fail(new ApiError('validation.malformed', 'multipart: exactly one file part is accepted')));
    bb.on('error', (err: Error) => fail(new ApiError('validation.malformed', `multipart: ${err.message}`)));
    bb.on('close', () => {
      if (settled) return;
      if (!staged) return fail(new ApiError('validation.malformed', "multipart: the part 'file' is required, with a readable filename (a malformed filename* makes it unreadable)"));
      staged.then(
        (upload) => {
          if (settled) return;
          settled = true;
          resolve(upload);
        },
        () => undefined,
      );
    });

    req.on('data', (chunk: Buffer) => {
      received += chunk.length;
      if (received > maxBody) fail(tooLarge('the upload', maxBody));
    });
    req.on('aborted', () => fail(new ApiError('validation.malformed', 'the request body was cut short')));
    req.pipe(bb);
  });
}
