/**
 * A minimal, deterministic POSIX tar (ustar + PAX long names) writer. Used to build the sandbox
 * image context and to copy Session resources into a sandbox workspace. Entries carry explicit
 * ownership and modes so that files land owned by the sandbox user, never by the daemon's uid.
 */

export type TarEntry =
  | { type: 'file'; path: string; data: Buffer; mode?: number; uid?: number; gid?: number }
  | { type: 'dir'; path: string; mode?: number; uid?: number; gid?: number }
  | { type: 'symlink'; path: string; target: string; uid?: number; gid?: number };

const BLOCK = 512;

function octal(value: number, width: number): string {
  return value.toString(8).padStart(width - 1, '0') + '\0';
}

function header(name: string, size: number, typeflag: string, mode: number, uid: number, gid: number, linkname = ''): Buffer {
  const buf = Buffer.alloc(BLOCK, 0);
  buf.write(name, 0, 100, 'utf8');
  buf.write(octal(mode & 0o7777, 8), 100, 8, 'ascii');
  buf.write(octal(uid, 8), 108, 8, 'ascii');
  buf.write(octal(gid, 8), 116, 8, 'ascii');
  buf.write(octal(size, 12), 124, 12, 'ascii');
  buf.write(octal(0, 12), 136, 12, 'ascii'); // mtime 0: content-addressed, reproducible
  buf.write('        ', 148, 8, 'ascii'); // checksum placeholder
  buf.write(typeflag, 156, 1, 'ascii');
  buf.write(linkname, 157, 100, 'utf8');
  buf.write('ustar\0', 257, 6, 'ascii');
  buf.write('00', 263, 2, 'ascii');
  let sum = 0;
  for (const byte of buf) sum += byte;
  buf.write(octal(sum, 7) + ' ', 148, 8, 'ascii');
  return buf;
}

function pad(size: number): Buffer {
  const rest = size % BLOCK;
  return rest === 0 ? Buffer.alloc(0) : Buffer.alloc(BLOCK - rest, 0);
}

function paxRecord(key: string, value: string): string {
  const body = ` ${key}=${value}\n`;
  let len = Buffer.byteLength(body) + 1;
  while (String(len).length + Buffer.byteLength(body) !== len) len = String(len).length + Buffer.byteLength(body);
  return `${len}${body}`;
}

/** Serialises entries into a tar archive (two zero blocks at the end). */
export function createTar(entries: readonly TarEntry[]): Buffer {
  const parts: Buffer[] = [];
  for (const entry of entries) {
    let name = entry.path.replace(/^\/+/, '');
    if (entry.type === 'dir' && !name.endsWith('/')) name += '/';
    const linkname = entry.type === 'symlink' ? entry.target : '';
    const uid = entry.uid ?? 0;
    const gid = entry.gid ?? 0;
    if (Buffer.byteLength(name) > 99 || Buffer.byteLength(linkname) > 99) {
      let pax = paxRecord('path', name);
      if (linkname) pax += paxRecord('linkpath', linkname);
      const data = Buffer.from(pax, 'utf8');
      parts.push(header('PaxHeader', data.length, 'x', 0o644, 0, 0), data, pad(data.length));
      name = name.slice(0, 99);
    }
    if (entry.type === 'file') {
      parts.push(header(name, entry.data.length, '0', entry.mode ?? 0o644, uid, gid), entry.data, pad(entry.data.length));
    } else if (entry.type === 'dir') {
      parts.push(header(name, 0, '5', entry.mode ?? 0o755, uid, gid));
    } else {
      parts.push(header(name, 0, '2', 0o777, uid, gid, linkname.slice(0, 99)));
    }
  }
  parts.push(Buffer.alloc(BLOCK * 2, 0));
  return Buffer.concat(parts);
}
