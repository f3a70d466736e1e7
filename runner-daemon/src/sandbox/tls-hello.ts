/**
 * Reads the server name (SNI) a TLS client asks for from the first bytes it sends: the egress
 * proxy checks it against the host a `CONNECT` named before the bytes go upstream (docs/SANDBOX.md,
 * "Egress allowlist"). Only the ClientHello's framing and its `server_name` extension are read
 * (RFC 8446 §4.1.2, RFC 6066 §3); nothing is decrypted and nothing else is judged.
 */

/** What the first bytes of a tunnelled connection are, as far as the proxy cares. */
export type ClientHelloRead =
  /** More bytes are needed to tell. */
  | { kind: 'incomplete' }
  /** Not a TLS handshake (a protocol of its own, or plain HTTP). */
  | { kind: 'not_tls' }
  /** Framed as TLS, and not a ClientHello a server would read. */
  | { kind: 'bad'; reason: string }
  /** A whole ClientHello: the host name it asks for, or null when it names none. */
  | { kind: 'hello'; serverName: string | null };

const HANDSHAKE = 22;
const CLIENT_HELLO = 1;
const SERVER_NAME = 0;
const HOST_NAME = 0;
/** A ClientHello longer than this is not read (real ones are a few KiB, post-quantum key shares included). */
export const MAX_CLIENT_HELLO = 64 * 1024;
/** The most a TLS record may carry (RFC 8446 §5.1, plus the slack TLS 1.2 allows for compression). */
const MAX_RECORD = 16384 + 2048;

/** A bounds-checked reader over one ClientHello body: each read throws `Short` past its end. */
class Cursor {
  private at = 0;
  constructor(private readonly b: Buffer) {}
  get left(): number {
    return this.b.length - this.at;
  }
  u8(): number {
    this.need(1);
    return this.b[this.at++]!;
  }
  u16(): number {
    this.need(2);
    const v = this.b.readUInt16BE(this.at);
    this.at += 2;
    return v;
  }
  bytes(n: number): Buffer {
    this.need(n);
    const v = this.b.subarray(this.at, this.at + n);
    this.at += n;
    return v;
  }
  skip(n: number): void {
    this.bytes(n);
  }
  private need(n: number): void {
    if (this.left < n) throw new Short();
  }
}

class Short extends Error {}

/**
 * Reads a ClientHello from the first bytes of a connection. A handshake message may span several
 * records; the records' content is joined until the message is whole.
 */
export function readClientHello(bytes: Buffer): ClientHelloRead {
  if (bytes.length === 0) return { kind: 'incomplete' };
  // A TLS record: content type 22 (handshake), then a 3.x version. Anything else is not TLS.
  if (bytes[0] !== HANDSHAKE) return { kind: 'not_tls' };
  if (bytes.length < 2) return { kind: 'incomplete' };
  if (bytes[1] !== 3) return { kind: 'not_tls' };
  const fragments: Buffer[] = [];
  let joined = 0;
  let at = 0;
  for (;;) {
    if (bytes.length < at + 5) return { kind: 'incomplete' };
    if (bytes[at] !== HANDSHAKE || bytes[at + 1] !== 3) return { kind: 'bad', reason: 'a handshake record is interleaved with another' };
    const len = bytes.readUInt16BE(at + 3);
    if (len === 0 || len > MAX_RECORD) return { kind: 'bad', reason: 'a TLS record of an impossible length' };
    if (bytes.length < at + 5 + len) return { kind: 'incomplete' };
    fragments.push(bytes.subarray(at + 5, at + 5 + len));
    joined += len;
    at += 5 + len;
    const message = fragments.length === 1 ? fragments[0]! : Buffer.concat(fragments, joined);
    if (message[0] !== CLIENT_HELLO) return { kind: 'bad', reason: 'the first handshake message is not a ClientHello' };
    if (message.length < 4) continue;
    const bodyLength = message.readUIntBE(1, 3);
    if (bodyLength + 4 > MAX_CLIENT_HELLO) return { kind: 'bad', reason: `a ClientHello over ${MAX_CLIENT_HELLO / 1024} KiB` };
    if (message.length < 4 + bodyLength) continue;
    try {
      return { kind: 'hello', serverName: serverNameOf(message.subarray(4, 4 + bodyLength)) };
    } catch (err) {
      return { kind: 'bad', reason: err instanceof Short ? 'a truncated ClientHello' : (err as Error).message };
    }
  }
}

/** The `host_name` of a ClientHello body's `server_name` extension, or null without one. */
function serverNameOf(body: Buffer): string | null {
  const c = new Cursor(body);
  c.skip(2 + 32); // legacy_version, random
  c.skip(c.u8()); // legacy_session_id
  c.skip(c.u16()); // cipher_suites
  c.skip(c.u8()); // legacy_compression_methods
  if (c.left === 0) return null; // no extensions (an old client)
  const extensions = new Cursor(c.bytes(c.u16()));
  let found: string | null = null;
  let seen = false;
  while (extensions.left > 0) {
    const type = extensions.u16();
    const data = extensions.bytes(extensions.u16());
    if (type !== SERVER_NAME) continue;
    // A second server_name would be read one way here and another way by a server: refused.
    if (seen) throw new Error('two server_name extensions');
    seen = true;
    const list = new Cursor(data);
    const names = new Cursor(list.bytes(list.u16()));
    while (names.left > 0) {
      const nameType = names.u8();
      const name = names.bytes(names.u16());
      if (nameType !== HOST_NAME) continue;
      if (found !== null) throw new Error('two host names in server_name');
      // A host name is ASCII (RFC 6066: no trailing dot, IDNs in A-label form).
      if (name.length === 0 || name.some((ch) => ch <= 0x20 || ch >= 0x7f)) throw new Error('a server name that is not an ASCII host name');
      found = name.toString('latin1');
    }
  }
  return found;
}

/** The fatal `unrecognized_name` alert (RFC 6066 §3), what a server says to a name it does not serve. */
export const UNRECOGNIZED_NAME_ALERT = Buffer.from([21, 3, 3, 0, 2, 2, 112]);
