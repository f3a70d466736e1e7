import { spawn } from 'node:child_process';
import { createHash } from 'node:crypto';
import { PassThrough } from 'node:stream';
import { createServer, request, type Server } from 'node:http';
import { connect, createServer as createNetServer, type AddressInfo, type Socket } from 'node:net';
import { connect as tlsConnect } from 'node:tls';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { createLogger } from '@agentplane/core';
import { allowedBy, EgressTunnel, parseAllowRule, readProxyRequest, RelayEnded, relayReady, RELAY_SCRIPT, type EgressDecision, type EgressTunnelOptions } from './egress.js';
import type { SandboxProcess } from './types.js';

/** The relay as the sandbox runs it, here as a child process of the test (port 0: any free one). */
function startRelay(): SandboxProcess {
  const child = spawn(process.execPath, ['-e', RELAY_SCRIPT, '0'], { stdio: ['pipe', 'pipe', 'pipe'] });
  const ended = new Promise<{ exitCode: number; killed: boolean }>((resolve) => {
    child.on('exit', (code, signal) => resolve({ exitCode: code ?? 137, killed: signal !== null }));
  });
  return {
    stdin: child.stdin, stdout: child.stdout, stderr: child.stderr,
    wait: () => ended,
    kill: async () => {
      child.kill('SIGKILL');
      await ended;
    },
  };
}

let upstream: Server;
let upstreamPort = 0;
const log = createLogger({ name: 'egress-test', level: 'silent' });

beforeAll(async () => {
  upstream = createServer((req, res) => {
    let body = '';
    req.on('data', (d: Buffer) => (body += d.toString()));
    req.on('end', () => res.end(`${req.method} ${req.url} host=${req.headers.host} conn=${req.headers.connection} proxy=${req.headers['proxy-authorization'] ?? '-'} body=${body}`));
  });
  await new Promise<void>((resolve) => upstream.listen(0, '127.0.0.1', resolve));
  upstreamPort = (upstream.address() as AddressInfo).port;
});
afterAll(async () => {
  await new Promise((resolve) => upstream.close(resolve));
});

const open: Array<{ tunnel: EgressTunnel }> = [];
afterEach(async () => {
  for (const { tunnel } of open.splice(0)) await tunnel.close();
});

async function tunnelWith(allowed: string[], o: Partial<EgressTunnelOptions> = {}): Promise<{ port: number; tunnel: EgressTunnel; decisions: EgressDecision[]; relay: SandboxProcess }> {
  const relay = startRelay();
  const decisions: EgressDecision[] = [];
  const tunnel = new EgressTunnel(relay, allowed, { allowPrivate: true, log, onDecision: (d) => decisions.push(d), ...o });
  open.push({ tunnel });
  const port = await relayReady(relay, 10_000);
  return { port, tunnel, decisions, relay };
}

/** A plain-HTTP request through the proxy (absolute form), as curl or pip send it with HTTP_PROXY. */
function viaProxy(proxyPort: number, url: string, init: { method?: string; body?: string | Buffer; headers?: Record<string, string> } = {}): Promise<{ status: number; body: string }> {
  return new Promise((resolve, reject) => {
    const req = request({ host: '127.0.0.1', port: proxyPort, method: init.method ?? 'GET', path: url, headers: { host: new URL(url).host, ...(init.headers ?? {}) } }, (res) => {
      let body = '';
      res.on('data', (d: Buffer) => (body += d.toString()));
      res.on('end', () => resolve({ status: res.statusCode ?? 0, body }));
    });
    req.on('error', reject);
    req.end(init.body);
  });
}

/** A CONNECT tunnel, then one HTTP request over it (what an https client does, minus TLS). */
function viaConnect(proxyPort: number, target: string): Promise<string> {
  return new Promise((resolve, reject) => {
    const s = connect(proxyPort, '127.0.0.1');
    let text = '';
    s.on('connect', () => s.write(`CONNECT ${target} HTTP/1.1\r\nHost: ${target}\r\n\r\n`));
    s.on('data', (d: Buffer) => {
      text += d.toString('latin1');
      if (text.startsWith('HTTP/1.1 200 ') && text.includes('\r\n\r\n') && !text.includes('GET /over')) {
        text += 'GET /over';
        s.write(`GET /over-tunnel HTTP/1.1\r\nHost: ${target}\r\nConnection: close\r\n\r\n`);
      }
    });
    s.on('end', () => resolve(text.replace('GET /over', '')));
    s.on('error', reject);
  });
}

describe('allowed_hosts rules', () => {
  it('matches hosts exactly, subdomains with *., and 80/443 unless a port is named', () => {
    const rules = ['api.example.com', '*.pkg.dev', 'registry.npmjs.org:8443', '10.0.0.5:5432'].map(parseAllowRule);
    expect(allowedBy(rules, 'api.example.com', 443)).toBe(true);
    expect(allowedBy(rules, 'API.Example.com.', 80)).toBe(true);
    expect(allowedBy(rules, 'api.example.com', 22)).toBe(false);
    expect(allowedBy(rules, 'evil.api.example.com', 443)).toBe(false);
    expect(allowedBy(rules, 'example.com', 443)).toBe(false);
    expect(allowedBy(rules, 'a.b.pkg.dev', 443)).toBe(true);
    expect(allowedBy(rules, 'pkg.dev', 443)).toBe(false);
    expect(allowedBy(rules, 'xpkg.dev', 443)).toBe(false);
    expect(allowedBy(rules, 'registry.npmjs.org', 8443)).toBe(true);
    expect(allowedBy(rules, 'registry.npmjs.org', 443)).toBe(false);
    expect(allowedBy(rules, '10.0.0.5', 5432)).toBe(true);
  });

  it('reads CONNECT and absolute-form requests, rewriting the latter to one origin-form request', () => {
    expect(readProxyRequest(Buffer.from('CONNECT a.example:443 HTTP/1.1\r\nHost: a'))).toBeUndefined();
    const c = readProxyRequest(Buffer.from('CONNECT a.example:443 HTTP/1.1\r\nHost: a.example:443\r\n\r\nTLS'));
    expect(c).toMatchObject({ kind: 'connect', host: 'a.example', port: 443 });
    expect(c?.kind === 'connect' && c.rest.toString()).toBe('TLS');
    const f = readProxyRequest(Buffer.from('GET http://a.example/x?y=1 HTTP/1.1\r\nHost: a.example\r\nProxy-Authorization: Basic eA==\r\nConnection: keep-alive\r\n\r\n'));
    expect(f).toMatchObject({ kind: 'forward', host: 'a.example', port: 80 });
    expect(f?.kind === 'forward' && f.head.toString()).toBe('GET /x?y=1 HTTP/1.1\r\nHost: a.example\r\nConnection: close\r\n\r\n');
    const spoofed = readProxyRequest(Buffer.from('GET http://a.example:8080/ HTTP/1.1\r\nhost: other.example\r\nAccept: */*\r\n\r\n'));
    expect(spoofed?.kind === 'forward' && spoofed.head.toString()).toBe('GET / HTTP/1.1\r\nHost: a.example:8080\r\nAccept: */*\r\nConnection: close\r\n\r\n');
    expect(readProxyRequest(Buffer.from('CONNECT a.example HTTP/1.1\r\n\r\n'))).toMatchObject({ kind: 'bad', status: 400 });
    expect(readProxyRequest(Buffer.from('GET /relative HTTP/1.1\r\n\r\n'))).toMatchObject({ kind: 'bad', status: 400 });
    expect(readProxyRequest(Buffer.from('CONNECT user:pw@a.example:443 HTTP/1.1\r\n\r\n'))).toMatchObject({ kind: 'bad', status: 400 });
    expect(readProxyRequest(Buffer.alloc(17 * 1024, 'a'))).toMatchObject({ kind: 'bad', status: 431 });
  });
});

describe('egress tunnel through a real relay', () => {
  it('forwards an allowed plain-HTTP request as one origin-form request, without proxy credentials', async () => {
    const { port, decisions } = await tunnelWith([`127.0.0.1:${upstreamPort}`]);
    const r = await viaProxy(port, `http://127.0.0.1:${upstreamPort}/hello?q=1`, { method: 'POST', body: 'payload', headers: { 'proxy-authorization': 'Basic eA==' } });
    expect(r.status).toBe(200);
    expect(r.body).toBe(`POST /hello?q=1 host=127.0.0.1:${upstreamPort} conn=close proxy=- body=payload`);
    expect(decisions).toEqual([{ host: '127.0.0.1', port: upstreamPort, outcome: 'connected' }]);
  });

  it('tunnels an allowed CONNECT', async () => {
    const { port } = await tunnelWith([`127.0.0.1:${upstreamPort}`]);
    const text = await viaConnect(port, `127.0.0.1:${upstreamPort}`);
    expect(text).toMatch(/^HTTP\/1\.1 200 Connection Established\r\n\r\nHTTP\/1\.1 200 OK/);
    expect(text).toContain('GET /over-tunnel host=');
  });

  it('refuses a host or port not listed with 403, and connects nothing', async () => {
    let connections = 0;
    const count = (): void => {
      connections++;
    };
    upstream.on('connection', count);
    try {
      const { port, decisions } = await tunnelWith(['example.com']);
      const r = await viaProxy(port, `http://127.0.0.1:${upstreamPort}/`);
      expect(r.status).toBe(403);
      expect(r.body).toContain(`127.0.0.1:${upstreamPort}: not in the Environment's allowed_hosts`);
      const c = await viaConnect(port, `127.0.0.1:${upstreamPort}`);
      expect(c).toMatch(/^HTTP\/1\.1 403 Forbidden/);
      expect(decisions.map((d) => d.outcome)).toEqual(['refused', 'refused']);
      expect(connections).toBe(0);
    } finally {
      upstream.off('connection', count);
    }
  });

  it('refuses a listed name that resolves to a private address unless the runner allows private networks', async () => {
    const lookup = async (): Promise<Array<{ address: string; family: number }>> => [{ address: '93.184.215.14', family: 4 }, { address: '127.0.0.1', family: 4 }];
    const strict = await tunnelWith([`internal.example:${upstreamPort}`], { allowPrivate: false, lookup });
    const r = await viaProxy(strict.port, `http://internal.example:${upstreamPort}/`);
    expect(r.status).toBe(403);
    expect(r.body).toContain('resolves to a private or reserved address');
    const literal = await viaProxy(strict.port, `http://127.0.0.1:${upstreamPort}/`);
    expect(literal.status).toBe(403);

    // Both families: IPv4 is tried (an IPv6 address no server here listens on comes first).
    const loose = await tunnelWith([`internal.example:${upstreamPort}`], { allowPrivate: true, lookup: async () => [{ address: '::1', family: 6 }, { address: '127.0.0.1', family: 4 }] });
    const ok = await viaProxy(loose.port, `http://internal.example:${upstreamPort}/via-name`);
    expect(ok.status).toBe(200);
    expect(ok.body).toContain('GET /via-name host=internal.example');
  });

  it('answers 502 for a listed host that refuses the connection', async () => {
    const closed = createServer();
    await new Promise<void>((resolve) => closed.listen(0, '127.0.0.1', resolve));
    const deadPort = (closed.address() as AddressInfo).port;
    await new Promise((resolve) => closed.close(resolve));
    const { port, decisions } = await tunnelWith([`127.0.0.1:${deadPort}`]);
    const r = await viaProxy(port, `http://127.0.0.1:${deadPort}/`);
    expect(r.status).toBe(502);
    expect(r.body).toContain('ECONNREFUSED');
    expect(decisions[0]?.outcome).toBe('failed');
  });

  it('takes a new allowlist for the next connection, and ends when its relay dies', async () => {
    const { port, tunnel, relay } = await tunnelWith(['example.com']);
    expect((await viaProxy(port, `http://127.0.0.1:${upstreamPort}/`)).status).toBe(403);
    tunnel.setAllowed([`127.0.0.1:${upstreamPort}`]);
    expect((await viaProxy(port, `http://127.0.0.1:${upstreamPort}/`)).status).toBe(200);
    expect(tunnel.alive).toBe(true);
    expect(await tunnel.ping(5_000)).toBe(true);
    // A relay that reads no more (stopped, not yet seen to end) does not answer.
    relay.stdout.pause();
    (relay.stdin as NodeJS.WritableStream & { cork(): void }).cork();
    expect(await tunnel.ping(200)).toBe(false);
    await relay.kill();
    await new Promise<void>((resolve) => setImmediate(resolve));
    expect(tunnel.alive).toBe(false);
  });

  it('carries a large response and many connections at once', async () => {
    const big = createServer((_req, res) => res.end(Buffer.alloc(4 * 1024 * 1024, 'x')));
    await new Promise<void>((resolve) => big.listen(0, '127.0.0.1', resolve));
    const bigPort = (big.address() as AddressInfo).port;
    try {
      const { port } = await tunnelWith([`127.0.0.1:${bigPort}`, `127.0.0.1:${upstreamPort}`]);
      const results = await Promise.all([
        viaProxy(port, `http://127.0.0.1:${bigPort}/`),
        ...Array.from({ length: 20 }, (_, i) => viaProxy(port, `http://127.0.0.1:${upstreamPort}/n${i}`)),
      ]);
      expect(results[0]?.body.length).toBe(4 * 1024 * 1024);
      results.slice(1).forEach((r, i) => expect(r.body).toContain(`GET /n${i} `));
    } finally {
      await new Promise((resolve) => big.close(resolve));
    }
  });
});

/**
 * A CONNECT through the proxy: the socket, paused, once the proxy answered 200 (what came after
 * the answer in the same read pushed back), or the answer's text as the error when it did not.
 */
function tunnelTo(proxyPort: number, target: string): Promise<Socket> {
  return new Promise((resolve, reject) => {
    const s = connect(proxyPort, '127.0.0.1', () => s.write(`CONNECT ${target} HTTP/1.1\r\nHost: ${target}\r\n\r\n`));
    let got = Buffer.alloc(0);
    const onData = (d: Buffer): void => {
      got = Buffer.concat([got, d]);
      const end = got.indexOf('\r\n\r\n');
      if (end < 0) return;
      s.off('data', onData);
      s.pause();
      const after = got.subarray(end + 4);
      if (after.length > 0) s.unshift(after);
      if (got.toString('latin1').startsWith('HTTP/1.1 200 ')) resolve(s);
      else reject(new Error(got.toString('latin1')));
    };
    s.on('data', onData);
    s.on('error', reject);
  });
}

describe('the server name inside a CONNECT tunnel', () => {
  /** A plain TCP upstream that records what reaches it, and says hello first when `banner` is set. */
  async function recordingUpstream(banner?: string): Promise<{ port: number; received: () => Buffer; reached: Promise<Buffer>; close(): Promise<void> }> {
    let got = Buffer.alloc(0);
    let reachedResolve: (b: Buffer) => void = () => undefined;
    const reached = new Promise<Buffer>((resolve) => (reachedResolve = resolve));
    const sockets = new Set<Socket>();
    const server = createNetServer((s) => {
      sockets.add(s);
      if (banner) s.write(banner);
      s.on('data', (d: Buffer) => {
        got = Buffer.concat([got, d]);
        reachedResolve(got);
      });
      s.on('error', () => undefined);
    });
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    return {
      port: (server.address() as AddressInfo).port,
      received: () => got,
      reached,
      close: () => new Promise((resolve) => {
        server.close(() => resolve());
        for (const s of sockets) s.destroy();
      }),
    };
  }
  const lookup = async (): Promise<Array<{ address: string; family: number }>> => [{ address: '127.0.0.1', family: 4 }];

  it('lets a TLS client through that names the host it asked for, and refuses one naming another', async () => {
    const up = await recordingUpstream();
    try {
      const { port, decisions } = await tunnelWith([`upstream.test:${up.port}`], { lookup });
      // The listed name: its ClientHello reaches the upstream.
      const ok = await tunnelTo(port, `upstream.test:${up.port}`);
      const client = tlsConnect({ socket: ok, servername: 'Upstream.Test', rejectUnauthorized: false });
      client.on('error', () => undefined);
      const first = await up.reached;
      expect(first[0]).toBe(22);
      expect(first.includes(Buffer.from('Upstream.Test'))).toBe(true);
      client.destroy();
      expect(decisions).toEqual([{ host: 'upstream.test', port: up.port, outcome: 'connected' }]);

      // Another name, on the same checked address: nothing goes upstream; the client reads a TLS alert.
      const before = up.received().length;
      const fronted = await tunnelTo(port, `upstream.test:${up.port}`);
      const err = await new Promise<Error>((resolve) => {
        const c = tlsConnect({ socket: fronted, servername: 'elsewhere.test', rejectUnauthorized: false });
        c.on('error', resolve);
        c.on('secureConnect', () => resolve(new Error('connected')));
      });
      expect(err.message).toMatch(/unrecognized name/);
      expect(up.received().length).toBe(before);
      expect(decisions[1]).toEqual({ host: 'upstream.test', port: up.port, outcome: 'refused', reason: 'its TLS server name elsewhere.test is not the host it asked to CONNECT to' });
      expect(decisions).toHaveLength(2);
    } finally {
      await up.close();
    }
  });

  it('passes a protocol that is not TLS, one whose server speaks first included, and refuses a ClientHello cut short', async () => {
    const up = await recordingUpstream('SSH-2.0-upstream\r\n');
    try {
      const { port, decisions } = await tunnelWith([`upstream.test:${up.port}`], { lookup });
      const s = await tunnelTo(port, `upstream.test:${up.port}`);
      const banner = await new Promise<string>((resolve) => s.once('data', (d: Buffer) => resolve(d.toString())).resume());
      expect(banner).toBe('SSH-2.0-upstream\r\n');
      s.write('SSH-2.0-client\r\n');
      expect((await up.reached).toString()).toBe('SSH-2.0-client\r\n');
      s.destroy();
      expect(decisions.map((d) => d.outcome)).toEqual(['connected']);

      // Half a ClientHello, then the end: never sent on.
      const before = up.received().length;
      const cut = await tunnelTo(port, `upstream.test:${up.port}`);
      await new Promise<void>((resolve) => cut.once('data', () => resolve()).resume()); // the banner
      const answer = new Promise<Buffer>((resolve) => {
        const parts: Buffer[] = [];
        cut.on('data', (d: Buffer) => parts.push(d));
        cut.on('end', () => resolve(Buffer.concat(parts)));
      });
      cut.end(Buffer.from([22, 3, 1, 0, 200, 1, 0, 0, 196]));
      expect([...(await answer)]).toEqual([21, 3, 3, 0, 2, 2, 112]);
      expect(up.received().length).toBe(before);
      expect(decisions[1]).toMatchObject({ outcome: 'refused', reason: 'the connection ended inside its TLS ClientHello' });
    } finally {
      await up.close();
    }
  });
});

describe('what a sandbox cannot make the runner hold', () => {
  it('answers 503 to a connection past the open-connection bound', async () => {
    const { port } = await tunnelWith(['example.com'], { maxConnections: 2 });
    // Two connections held open mid-head: neither is decided, both count.
    const held = await Promise.all([0, 1].map(() => new Promise<ReturnType<typeof connect>>((resolve) => {
      const s = connect(port, '127.0.0.1', () => {
        s.write('CONNECT example.com:443 HTTP/1.1\r\n');
        resolve(s);
      });
    })));
    const third = await new Promise<string>((resolve, reject) => {
      const s = connect(port, '127.0.0.1');
      let text = '';
      s.on('data', (d: Buffer) => (text += d.toString('latin1')));
      s.on('end', () => {
        s.end();
        resolve(text);
      });
      s.on('error', reject);
    });
    expect(third).toMatch(/^HTTP\/1\.1 503 Service Unavailable/);
    expect(third).toContain('too many connections open');
    for (const s of held) s.destroy();
  });

  it('names what a relay that cannot start wrote (an image without node)', async () => {
    const stderr = new PassThrough();
    const fake: SandboxProcess = {
      stdin: new PassThrough(), stdout: new PassThrough(), stderr,
      wait: () => new Promise((resolve) => setImmediate(() => resolve({ exitCode: 127, killed: false }))),
      kill: async () => undefined,
    };
    stderr.write('bash: line 1: node: command not found\n');
    const err = await relayReady(fake, 5_000).then(() => undefined, (e: unknown) => e);
    expect(err).toBeInstanceOf(RelayEnded);
    expect((err as RelayEnded).message).toBe('the egress relay ended (exit 127): bash: line 1: node: command not found');
    expect((err as RelayEnded).nodeMissing).toBe(true);
    // Any other end (the port taken, a crash) is not the image's fault.
    expect(new RelayEnded(1, 'Error: listen EADDRINUSE: address already in use 127.0.0.1:3128').nodeMissing).toBe(false);
  });

  it('closes the tunnel on a frame longer than the relay ever writes, reading no further', async () => {
    const stdout = new PassThrough();
    let killed = false;
    let end: (v: { exitCode: number; killed: boolean }) => void = () => undefined;
    const ended = new Promise<{ exitCode: number; killed: boolean }>((resolve) => (end = resolve));
    const fake: SandboxProcess = {
      stdin: new PassThrough(), stdout, stderr: new PassThrough(), wait: () => ended,
      kill: async () => {
        killed = true;
        end({ exitCode: 137, killed: true });
      },
    };
    const tunnel = new EgressTunnel(fake, ['example.com'], { allowPrivate: false, log });
    const header = Buffer.alloc(9);
    header[0] = 2;
    header.writeUInt32BE(1, 1);
    header.writeUInt32BE(0x7fffffff, 5);
    stdout.write(header);
    await new Promise<void>((resolve) => setImmediate(resolve));
    expect(tunnel.alive).toBe(false);
    expect(killed).toBe(true);
  });

  it('refuses a connection that sends more than 1 MiB while it is being decided', async () => {
    let release: () => void = () => undefined;
    const gate = new Promise<void>((resolve) => (release = resolve));
    const { port, decisions } = await tunnelWith([`slow.example:${upstreamPort}`], {
      lookup: async () => {
        await gate;
        return [{ address: '127.0.0.1', family: 4 }];
      },
    });
    const answer = await new Promise<string>((resolve, reject) => {
      const s = connect(port, '127.0.0.1');
      let text = '';
      s.on('connect', () => {
        s.write(`POST http://slow.example:${upstreamPort}/up HTTP/1.1\r\nHost: slow.example\r\nContent-Length: ${2 * 1024 * 1024}\r\n\r\n`);
        s.write(Buffer.alloc(2 * 1024 * 1024, 'u'));
      });
      s.on('data', (d: Buffer) => (text += d.toString('latin1')));
      s.on('close', () => resolve(text));
      s.on('error', reject);
    });
    release();
    expect(answer).toMatch(/^HTTP\/1\.1 400 Bad Request/);
    expect(answer).toContain('more than 1 MiB sent before the connection was made');
    expect(decisions).toEqual([]);
  });

  it('carries a 16 MiB upload intact to an upstream that reads slowly', async () => {
    let resolveReceived: (v: { bytes: number; digest: string }) => void = () => undefined;
    const received = new Promise<{ bytes: number; digest: string }>((resolve) => (resolveReceived = resolve));
    const slow = createServer((req, res) => {
      const hash = createHash('sha256');
      let bytes = 0;
      // Reads a chunk, then waits a millisecond: the upload outpaces it, so the tunnel holds the relay.
      const pump = (): void => {
        const chunk = req.read() as Buffer | null;
        if (chunk) {
          hash.update(chunk);
          bytes += chunk.length;
        }
        if (!req.readableEnded) setTimeout(pump, 1);
      };
      req.on('end', () => {
        res.end('stored');
        resolveReceived({ bytes, digest: hash.digest('hex') });
      });
      pump();
    });
    await new Promise<void>((resolve) => slow.listen(0, '127.0.0.1', resolve));
    try {
      const slowPort = (slow.address() as AddressInfo).port;
      const { port, tunnel } = await tunnelWith([`127.0.0.1:${slowPort}`]);
      const body = Buffer.alloc(16 * 1024 * 1024);
      for (let i = 0; i < body.length; i += 4096) body.writeUInt32BE(i, i);
      const [r, got] = await Promise.all([
        viaProxy(port, `http://127.0.0.1:${slowPort}/upload`, { method: 'POST', body, headers: { 'content-type': 'application/octet-stream' } }),
        received,
      ]);
      expect(r).toEqual({ status: 200, body: 'stored' });
      expect(got.bytes).toBe(body.length);
      expect(got.digest).toBe(createHash('sha256').update(body).digest('hex'));
      // The relay was held while the upstream lagged: the runner never had the upload waiting in memory.
      expect(tunnel.stats.holds).toBeGreaterThan(0);
      expect(tunnel.stats.maxUpstreamBuffered).toBeLessThan(2 * 1024 * 1024);
    } finally {
      await new Promise((resolve) => slow.close(resolve));
    }
  });
});
