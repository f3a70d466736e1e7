import { spawn } from 'node:child_process';
import { createServer, request, type Server } from 'node:http';
import { connect, type AddressInfo } from 'node:net';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { createLogger } from '@agentplane/core';
import { allowedBy, EgressTunnel, parseAllowRule, readProxyRequest, relayReady, RELAY_SCRIPT, type EgressDecision, type EgressTunnelOptions } from './egress.js';
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
function viaProxy(proxyPort: number, url: string, init: { method?: string; body?: string; headers?: Record<string, string> } = {}): Promise<{ status: number; body: string }> {
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

    const loose = await tunnelWith([`internal.example:${upstreamPort}`], { allowPrivate: true, lookup: async () => [{ address: '127.0.0.1', family: 4 }] });
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
