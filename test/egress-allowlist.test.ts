import { createServer, type Server } from 'node:http';
import { createServer as createTlsServer, type Server as TlsServer } from 'node:https';
import type { AddressInfo } from 'node:net';
import Docker from 'dockerode';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { freePort } from '@agentplane/store';
import { waitFor } from './harness/platform.js';
import { SCRIPT, untilEvents, type TurnPlatform, startTurnPlatform } from './harness/turns.js';
import { makeTestPki, type TestPki } from './harness/tls-certs.js';

/**
 * An Environment with `network: {mode: "allowlist", allowed_hosts}` end to end: the local runner
 * offers the mode, the Run is leased to it, and a tool command in the sandbox reaches a listed
 * host through the runner's egress proxy while an unlisted one is refused (403 from the proxy,
 * nothing connected). The test's upstream listens on this machine's loopback, a private address:
 * the runner's operator allows private networks here (`RUNNER_EGRESS_ALLOW_PRIVATE_NETWORKS`).
 */
let t: TurnPlatform;
let upstream: Server;
let port = 0;
let metricsPort = 0;
const seen: string[] = [];
/** An https upstream (a certificate for 127.0.0.1 from a test CA): a tunnel's TLS goes end to end. */
let pki: TestPki;
let tlsUpstream: TlsServer;
let tlsPort = 0;
const seenTls: string[] = [];

beforeAll(async () => {
  upstream = createServer((req, res) => {
    seen.push(`${req.method} ${req.url}`);
    res.end(`upstream saw ${req.method} ${req.url}`);
  });
  await new Promise<void>((resolve) => upstream.listen(0, '127.0.0.1', resolve));
  port = (upstream.address() as AddressInfo).port;
  pki = makeTestPki();
  tlsUpstream = createTlsServer({ ...pki.server }, (req, res) => {
    seenTls.push(`${req.method} ${req.url}`);
    res.end(`tls upstream saw ${req.method} ${req.url}`);
  });
  await new Promise<void>((resolve) => tlsUpstream.listen(0, '127.0.0.1', resolve));
  tlsPort = (tlsUpstream.address() as AddressInfo).port;
  metricsPort = await freePort();
  t = await startTurnPlatform({
    name: 'egress-allowlist',
    env: { RUNNER_EGRESS_ALLOW_PRIVATE_NETWORKS: 'true', RUNNER_METRICS_ADDR: `127.0.0.1:${metricsPort}` },
    environment: { network: { mode: 'allowlist', allowed_hosts: [`127.0.0.1:${port}`, '*.example.org', `127.0.0.1:${tlsPort}`] } },
  });
}, 180_000);

afterAll(async () => {
  await t?.p.stop();
  await new Promise((resolve) => upstream?.close(resolve));
  await new Promise((resolve) => tlsUpstream?.close(resolve));
  pki?.dispose();
});

/** A tool command: GETs through the sandbox's HTTP_PROXY, one line per URL (`<status> <body>` or `ERR <code>`). */
const FETCH = "for (const url of process.argv.slice(1)) { const u = new URL(process.env.HTTP_PROXY); await new Promise((done) => require('http').get({ host: u.hostname, port: u.port, path: url, headers: { host: new URL(url).host } }, (r) => { let b = ''; r.on('data', (d) => (b += d)); r.on('end', () => { console.log(r.statusCode + ' ' + b.trim()); done(); }); }).on('error', (e) => { console.log('ERR ' + e.code); done(); })); }";

/**
 * A tool command: an https GET through a CONNECT tunnel of the sandbox's HTTPS_PROXY, the TLS
 * verified against the test CA (base64, argv 1), once naming no server (an IP address) and once
 * naming another server in its TLS (`elsewhere.example`). One line each: `<status line> <body>`,
 * or `ERR <message>`.
 */
const TLS_FETCH = "const [ca, port] = process.argv.slice(1); const u = new URL(process.env.HTTPS_PROXY); const net = require('net'); const tls = require('tls');" +
  " for (const servername of [undefined, 'elsewhere.example']) { await new Promise((done) => { const s = net.connect(Number(u.port), u.hostname, () => s.write('CONNECT 127.0.0.1:' + port + ' HTTP/1.1\\r\\nHost: 127.0.0.1:' + port + '\\r\\n\\r\\n'));" +
  " s.once('data', () => { const t = tls.connect({ socket: s, host: '127.0.0.1', ca: Buffer.from(ca, 'base64').toString(), ...(servername ? { servername, checkServerIdentity: () => undefined } : {}) }, () => t.write('GET /over-tls HTTP/1.1\\r\\nHost: 127.0.0.1\\r\\nConnection: close\\r\\n\\r\\n'));" +
  " let b = ''; t.on('data', (d) => (b += d)); t.on('end', () => { console.log(b.split('\\r\\n')[0] + ' ' + b.split('\\r\\n\\r\\n')[1]); done(); }); t.on('error', (e) => { console.log('ERR ' + e.message); done(); }); }); }); }";

describe('network mode allowlist', () => {
  it('is offered by the docker runner, and a Run\'s tool command reaches listed hosts only', async () => {
    const presences = await t.p.root.get<{ data: { status: string; capabilities: { providers: { id: string; network_modes?: string[] }[] } }[] }>('/v1/runner-pools/presences');
    const docker = presences.data.find((x) => x.status === 'ready')?.capabilities.providers.find((x) => x.id === 'docker');
    // Only the modes a sandbox is made with (an engine's bridge driver is not one).
    expect(docker?.network_modes).toEqual(['none', 'allowlist']);

    const s = await t.api.post<{ id: string }>('/v1/sessions', {
      agent: {
        name: 'fetcher', model: 'default', tools: [{ type: 'builtin', name: 'bash' }],
        system: SCRIPT([
          { when: { user_contains: 'fetch' }, then: [{ tool: 'bash', input: { command: `node -e "(async () => { ${FETCH} })()" http://127.0.0.1:${port}/from-agent http://example.com/ http://127.0.0.1:1/; ls /sys/class/net` } }] },
          { when: { on: 'tool_result' }, then: [{ reply: 'result: {{tool_result}}' }] },
        ]),
      },
      environment_id: t.envId,
    });
    await t.api.post(`/v1/sessions/${s.id}/events`, t.msg('fetch'));
    const events = await untilEvents(t.api, s.id, (e) => e.some((x) => x.type === 'session.status_idle'), 120_000);
    const reply = JSON.stringify(events.filter((e) => e.type === 'agent.message').map((e) => e.payload));
    expect(reply).toContain(`200 upstream saw GET /from-agent`);
    expect(reply).toContain("403 agentplane egress: example.com:80: not in the Environment's allowed_hosts");
    expect(reply).toContain("403 agentplane egress: 127.0.0.1:1: not in the Environment's allowed_hosts");
    // The sandbox itself still has no network device but loopback.
    expect(reply).toMatch(/allowed_hosts\\n\s*lo\b/);
    expect(seen).toEqual(['GET /from-agent']);
    const [run] = (await t.api.get<{ data: { status: string }[] }>(`/v1/sessions/${s.id}/runs`)).data;
    expect(run?.status).toBe('succeeded');

    const [box] = await new Docker().listContainers({ filters: JSON.stringify({ label: [`agentplane.session=${s.id}`] }) });
    expect((await new Docker().getContainer(box!.Id).inspect()).HostConfig.NetworkMode).toBe('none');

    // Every decision is counted on the runner's metrics.
    const text = await waitFor('the egress counters', async () => {
      const body = await fetch(`http://127.0.0.1:${metricsPort}/metrics`).then((r) => r.text());
      return /agentplane_runner_egress_connections_total\{outcome="refused"\} 2/.test(body) ? body : undefined;
    }, 10_000);
    expect(text).toMatch(/agentplane_runner_egress_connections_total\{outcome="connected"\} 1/);
  }, 180_000);

  it('carries a tunnel\'s TLS end to end, and refuses one that names another server inside it', async () => {
    const s = await t.api.post<{ id: string }>('/v1/sessions', {
      agent: {
        name: 'tls-fetcher', model: 'default', tools: [{ type: 'builtin', name: 'bash' }],
        system: SCRIPT([
          { when: { user_contains: 'fetch' }, then: [{ tool: 'bash', input: { command: `node -e "(async () => { ${TLS_FETCH} })()" ${Buffer.from(pki.ca).toString('base64')} ${tlsPort}` } }] },
          { when: { on: 'tool_result' }, then: [{ reply: 'result: {{tool_result}}' }] },
        ]),
      },
      environment_id: t.envId,
    });
    await t.api.post(`/v1/sessions/${s.id}/events`, t.msg('fetch'));
    const events = await untilEvents(t.api, s.id, (e) => e.some((x) => x.type === 'session.status_idle'), 120_000);
    const reply = JSON.stringify(events.filter((e) => e.type === 'agent.message').map((e) => e.payload));
    expect(reply).toContain('HTTP/1.1 200 OK tls upstream saw GET /over-tls');
    expect(reply).toMatch(/ERR [^\\]*unrecognized name/);
    expect(seenTls).toEqual(['GET /over-tls']);
  }, 180_000);
});
