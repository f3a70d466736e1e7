import { createServer, type AddressInfo } from 'node:net';
import { connect as tlsConnect } from 'node:tls';
import { describe, expect, it } from 'vitest';
import { readClientHello } from './tls-hello.js';

/** The first flight of Node's own TLS client (OpenSSL's ClientHello), as a server would read it. */
async function realHello(servername?: string): Promise<Buffer> {
  let got: Buffer = Buffer.alloc(0);
  const server = createServer((s) => {
    s.on('data', (d: Buffer) => {
      got = Buffer.concat([got, d]);
      if (readClientHello(got).kind !== 'incomplete') s.destroy();
    });
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const port = (server.address() as AddressInfo).port;
  try {
    await new Promise<void>((resolve) => {
      const c = tlsConnect({ host: '127.0.0.1', port, rejectUnauthorized: false, ...(servername !== undefined ? { servername } : {}) });
      c.on('error', () => resolve());
      c.on('close', () => resolve());
    });
  } finally {
    await new Promise((resolve) => server.close(resolve));
  }
  return got;
}

/** One TLS record of type 22 around `fragment`. */
function record(fragment: Buffer): Buffer {
  const h = Buffer.from([22, 3, 1, 0, 0]);
  h.writeUInt16BE(fragment.length, 3);
  return Buffer.concat([h, fragment]);
}

/** A ClientHello body with the given extensions (type, data), framed as one handshake message. */
function helloWith(extensions: Array<[number, Buffer]>): Buffer {
  const ext = Buffer.concat(extensions.map(([type, data]) => {
    const h = Buffer.alloc(4);
    h.writeUInt16BE(type, 0);
    h.writeUInt16BE(data.length, 2);
    return Buffer.concat([h, data]);
  }));
  const extLen = Buffer.alloc(2);
  extLen.writeUInt16BE(ext.length);
  const body = Buffer.concat([Buffer.from([3, 3]), Buffer.alloc(32, 7), Buffer.from([0]), Buffer.from([0, 2, 0x13, 0x01]), Buffer.from([1, 0]), extLen, ext]);
  const msg = Buffer.alloc(4);
  msg[0] = 1;
  msg.writeUIntBE(body.length, 1, 3);
  return Buffer.concat([msg, body]);
}

function sni(...names: string[]): Buffer {
  const entries = Buffer.concat(names.map((n) => {
    const h = Buffer.alloc(3);
    h.writeUInt16BE(n.length, 1);
    return Buffer.concat([h, Buffer.from(n, 'latin1')]);
  }));
  const len = Buffer.alloc(2);
  len.writeUInt16BE(entries.length);
  return Buffer.concat([len, entries]);
}

describe('reading a TLS ClientHello', () => {
  it('reads the server name of a real client, and none where it names none', async () => {
    const hello = await realHello('api.example.com');
    expect(readClientHello(hello)).toEqual({ kind: 'hello', serverName: 'api.example.com' });
    expect(readClientHello(await realHello())).toEqual({ kind: 'hello', serverName: null });
  });

  it('asks for more bytes until the message is whole, however it is cut', async () => {
    const hello = await realHello('a.example');
    for (const cut of [1, 2, 5, 6, 9, 50, hello.length - 1]) {
      expect(readClientHello(hello.subarray(0, cut))).toEqual({ kind: 'incomplete' });
    }
    // The same message spread over three records.
    const message = hello.subarray(5);
    const split = Buffer.concat([record(message.subarray(0, 3)), record(message.subarray(3, 100)), record(message.subarray(100))]);
    expect(readClientHello(split)).toEqual({ kind: 'hello', serverName: 'a.example' });
    expect(readClientHello(split.subarray(0, split.length - 1))).toEqual({ kind: 'incomplete' });
  });

  it('tells other protocols from TLS by their first bytes', () => {
    expect(readClientHello(Buffer.from('GET / HTTP/1.1\r\n'))).toEqual({ kind: 'not_tls' });
    expect(readClientHello(Buffer.from('SSH-2.0-OpenSSH_9.2\r\n'))).toEqual({ kind: 'not_tls' });
    expect(readClientHello(Buffer.from([22, 1]))).toEqual({ kind: 'not_tls' });
    expect(readClientHello(Buffer.from([22]))).toEqual({ kind: 'incomplete' });
  });

  it('refuses what a server would read another way, or not at all', () => {
    expect(readClientHello(record(helloWith([[0, sni('a.example')]])))).toEqual({ kind: 'hello', serverName: 'a.example' });
    // Two server_name extensions, two host names in one, a name that is not ASCII.
    expect(readClientHello(record(helloWith([[0, sni('a.example')], [0, sni('b.example')]])))).toMatchObject({ kind: 'bad', reason: 'two server_name extensions' });
    expect(readClientHello(record(helloWith([[0, sni('a.example', 'b.example')]])))).toMatchObject({ kind: 'bad', reason: 'two host names in server_name' });
    expect(readClientHello(record(helloWith([[0, sni('a example')]])))).toMatchObject({ kind: 'bad' });
    // An extension longer than the message that holds it.
    const long = helloWith([[0, sni('a.example')]]);
    long.writeUInt16BE(0xff00, long.length - sni('a.example').length - 2);
    expect(readClientHello(record(long))).toEqual({ kind: 'bad', reason: 'a truncated ClientHello' });
    // Another handshake message first, a record of length 0, another record type in between.
    const finished = Buffer.from(helloWith([]));
    finished[0] = 20;
    expect(readClientHello(record(finished))).toMatchObject({ kind: 'bad' });
    expect(readClientHello(Buffer.from([22, 3, 1, 0, 0]))).toMatchObject({ kind: 'bad' });
    const message = helloWith([[0, sni('a.example')]]);
    const alert = Buffer.from([21, 3, 3, 0, 2, 1, 0]);
    expect(readClientHello(Buffer.concat([record(message.subarray(0, 10)), alert]))).toMatchObject({ kind: 'bad' });
    // A message that says it is longer than any ClientHello read here.
    const huge = Buffer.from([1, 0x02, 0x00, 0x00]);
    expect(readClientHello(record(huge))).toMatchObject({ kind: 'bad', reason: 'a ClientHello over 64 KiB' });
  });
});
