import type { IncomingMessage } from 'node:http';
import { ApiError } from '@agentplane/core';
import { checkSkillPath, SKILL_ENTRY, SKILL_LIMITS, type SkillFile } from '@agentplane/domain';
import { drainRequest } from '../http/body.js';

const BLOCK = 512;

const bad = (message: string) => new ApiError('validation.malformed', `tar: ${message}`);

function readString(buf: Buffer, offset: number, length: number): string {
  const slice = buf.subarray(offset, offset + length);
  const nul = slice.indexOf(0);
  return slice.subarray(0, nul === -1 ? slice.length : nul).toString('utf8');
}

function readOctal(buf: Buffer, offset: number, length: number, field: string): number {
  // Base-256 (GNU) sizes are for members over 8 GiB: far beyond every skill limit.
  if ((buf[offset] ?? 0) & 0x80) throw bad(`a member's ${field} is over the limits`);
  const text = readString(buf, offset, length).trim();
  if (text === '') return 0;
  if (!/^[0-7]+$/.test(text)) throw bad(`a member header has a malformed ${field}`);
  return parseInt(text, 8);
}

function checksumOk(header: Buffer): boolean {
  let sum = 0;
  for (let i = 0; i < BLOCK; i++) sum += i >= 148 && i < 156 ? 0x20 : (header[i] ?? 0);
  const stored = readString(header, 148, 8).trim();
  return /^[0-7]+$/.test(stored) && parseInt(stored, 8) === sum;
}

/** `path` and `size` of a PAX extended header (`<len> <key>=<value>\n` records). */
function parsePax(data: Buffer): Map<string, string> {
  const out = new Map<string, string>();
  let i = 0;
  while (i < data.length) {
    const space = data.indexOf(0x20, i);
    if (space === -1) break;
    const len = Number(data.subarray(i, space).toString('ascii'));
    if (!Number.isInteger(len) || len <= 0 || i + len > data.length) throw bad('a PAX header record is malformed');
    const record = data.subarray(space + 1, i + len - 1).toString('utf8');
    const eq = record.indexOf('=');
    if (eq > 0) out.set(record.slice(0, eq), record.slice(eq + 1));
    i += len;
  }
  return out;
}

type Kind = 'file' | 'dir' | 'pax' | 'global' | 'longname' | 'skip';
type ReaderState = { kind: 'header' } | { kind: 'data'; entry: Kind; path: string; size: number; mode: number } | { kind: 'end' };

/**
 * A tar archive (`ustar`, PAX and GNU long names) read as it streams in, with every Skill limit
 * checked at the earliest byte that shows it: the archive past 4 MiB, the 257th file, a member
 * over 1 MiB or the running total over 2 MiB (from the member's header, before its content
 * arrives), a path that escapes the directory (absolute, `..`), and any member that is not a
 * regular file or a directory (symbolic and hard links, devices, FIFOs). Every breach is a 400
 * `validation.malformed` and the rest of the body is drained, not read.
 *
 * A single top-level directory holding `SKILL.md` (`tar -cf s.tar my-skill/`) is the skill's
 * root; so is `./`.
 */
export class SkillTarReader {
  private pending: Buffer[] = [];
  private pendingBytes = 0;
  private received = 0;
  private state: ReaderState = { kind: 'header' };
  private pax = new Map<string, string>();
  private longName: string | null = null;
  private zeroBlocks = 0;
  private total = 0;
  readonly files: SkillFile[] = [];

  /** Feeds bytes; throws at the first breach. */
  push(chunk: Buffer): void {
    this.received += chunk.length;
    if (this.received > SKILL_LIMITS.maxArchiveBytes) throw bad(`the archive is larger than ${SKILL_LIMITS.maxArchiveBytes} bytes (4 MiB)`);
    if (this.state.kind === 'end') return;
    this.pending.push(chunk);
    this.pendingBytes += chunk.length;
    for (;;) {
      // `header()` may have moved the state on: read it afresh.
      const state = this.state as ReaderState;
      if (state.kind === 'end') return;
      if (state.kind === 'header') {
        if (this.pendingBytes < BLOCK) return;
        this.header(this.take(BLOCK));
        continue;
      }
      const padded = Math.ceil(state.size / BLOCK) * BLOCK;
      if (this.pendingBytes < padded) return;
      const data = this.take(padded).subarray(0, state.size);
      this.member(state.entry, state.path, data, state.mode);
      this.state = { kind: 'header' };
    }
  }

  /** The archive ended: the skill's files, with the root directory resolved. */
  finish(): SkillFile[] {
    if (this.state.kind === 'data' || (this.state.kind === 'header' && this.pendingBytes > 0)) throw bad('the archive ends in the middle of a member');
    if (this.received === 0) throw bad('the body is empty');
    return rootOf(this.files);
  }

  private take(n: number): Buffer {
    const all = this.pending.length === 1 ? (this.pending[0] as Buffer) : Buffer.concat(this.pending);
    const out = all.subarray(0, n);
    const rest = all.subarray(n);
    this.pending = rest.length > 0 ? [rest] : [];
    this.pendingBytes = rest.length;
    return out;
  }

  private header(h: Buffer): void {
    if (h.every((b) => b === 0)) {
      this.zeroBlocks += 1;
      if (this.zeroBlocks >= 2) this.state = { kind: 'end' };
      return;
    }
    if (this.zeroBlocks > 0) throw bad('a member follows an end-of-archive block');
    if (!checksumOk(h)) throw bad('not a tar archive (a header checksum does not match)');
    const typeflag = String.fromCharCode(h[156] ?? 0);
    const size = readOctal(h, 124, 12, 'size');
    const mode = readOctal(h, 100, 8, 'mode');
    const magic = readString(h, 257, 6);
    const prefix = magic.startsWith('ustar') ? readString(h, 345, 155) : '';
    let path = this.pax.get('path') ?? this.longName ?? (prefix ? `${prefix}/${readString(h, 0, 100)}` : readString(h, 0, 100));
    const paxSize = this.pax.get('size');
    const realSize = paxSize !== undefined && (typeflag === '0' || typeflag === '\0' || typeflag === '7') ? Number(paxSize) : size;
    let kind: Kind;
    switch (typeflag) {
      case '0': case '\0': case '7': kind = 'file'; break;
      case '5': kind = 'dir'; break;
      case 'x': kind = 'pax'; break;
      case 'g': kind = 'global'; break;
      case 'L': kind = 'longname'; break;
      case '1': throw bad(`'${path.slice(0, 80)}' is a hard link; a skill holds regular files and directories only`);
      case '2': throw bad(`'${path.slice(0, 80)}' is a symbolic link; a skill holds regular files and directories only`);
      default: throw bad(`'${path.slice(0, 80)}' is a special file (type '${typeflag}'); a skill holds regular files and directories only`);
    }
    // Metadata members are bounded too: they are not files, but they are bytes held in memory.
    if ((kind === 'pax' || kind === 'global' || kind === 'longname') && realSize > 64 * 1024) throw bad('an extended header is larger than 64 KiB');
    if (kind === 'file' || kind === 'dir') {
      this.pax = new Map();
      this.longName = null;
      path = normaliseMember(path, kind);
      if (kind === 'file') {
        if (this.files.length + 1 > SKILL_LIMITS.maxFiles) throw bad(`more than ${SKILL_LIMITS.maxFiles} files; a skill holds at most ${SKILL_LIMITS.maxFiles}`);
        if (realSize > SKILL_LIMITS.maxFileBytes) throw bad(`'${path.slice(0, 80)}' is ${realSize} bytes; a skill file holds at most ${SKILL_LIMITS.maxFileBytes} bytes (1 MiB)`);
        this.total += realSize;
        if (this.total > SKILL_LIMITS.maxTotalBytes) throw bad(`more than ${SKILL_LIMITS.maxTotalBytes} bytes of files; a skill holds at most 2 MiB across its files`);
      }
    }
    if (!Number.isSafeInteger(realSize) || realSize < 0) throw bad('a member has a malformed size');
    this.state = { kind: 'data', entry: kind, path, size: kind === 'dir' ? 0 : realSize, mode };
  }

  private member(kind: Kind, path: string, data: Buffer, mode: number): void {
    if (kind === 'pax') this.pax = parsePax(data);
    else if (kind === 'longname') this.longName = readString(data, 0, data.length);
    else if (kind === 'file') this.files.push({ path, content: Buffer.from(data), executable: (mode & 0o111) !== 0 });
  }
}

/** `./a/b` → `a/b`; a directory's trailing `/` dropped; anything absolute or with `..` refused. */
function normaliseMember(raw: string, kind: Kind): string {
  let p = raw;
  while (p.startsWith('./')) p = p.slice(2);
  if (kind === 'dir') p = p.replace(/\/+$/, '');
  if (kind === 'dir' && (p === '' || p === '.')) return '';
  if (p.startsWith('/') || p.split('/').includes('..')) throw bad(`'${raw.slice(0, 80)}' escapes the skill directory`);
  if (kind === 'dir') return p;
  checkSkillPath(p, 'tar member');
  return p;
}

/** The skill root: the archive root, or its one top-level directory when `SKILL.md` is there. */
function rootOf(files: SkillFile[]): SkillFile[] {
  if (files.some((f) => f.path === SKILL_ENTRY)) return files;
  const tops = new Set(files.map((f) => f.path.split('/')[0] ?? ''));
  const [top] = [...tops];
  if (tops.size === 1 && top && files.every((f) => f.path.includes('/')) && files.some((f) => f.path === `${top}/${SKILL_ENTRY}`)) {
    return files.map((f) => ({ ...f, path: f.path.slice(top.length + 1) }));
  }
  return files;
}

/** Reads an `application/x-tar` request body into skill files, with every limit checked as it streams. */
export function receiveSkillTar(req: IncomingMessage): Promise<SkillFile[]> {
  const type = (req.headers['content-type'] ?? '').split(';')[0]?.trim().toLowerCase();
  if (type !== 'application/x-tar') {
    drainRequest(req);
    return Promise.reject(new ApiError('validation.malformed', 'body: the import takes Content-Type application/x-tar'));
  }
  const declared = Number(req.headers['content-length']);
  if (Number.isFinite(declared) && declared > SKILL_LIMITS.maxArchiveBytes) {
    drainRequest(req);
    return Promise.reject(bad(`the archive is larger than ${SKILL_LIMITS.maxArchiveBytes} bytes (4 MiB)`));
  }
  const reader = new SkillTarReader();
  return new Promise<SkillFile[]>((resolve, reject) => {
    let settled = false;
    const fail = (err: unknown) => {
      if (settled) return;
      settled = true;
      req.off('data', onData);
      drainRequest(req);
      reject(err);
    };
    const onData = (chunk: Buffer) => {
      try {
        reader.push(chunk);
      } catch (err) {
        fail(err);
      }
    };
    req.on('data', onData);
    req.once('end', () => {
      if (settled) return;
      try {
        const files = reader.finish();
        settled = true;
        resolve(files);
      } catch (err) {
        fail(err);
      }
    });
    req.once('error', (err) => fail(err));
  });
}
