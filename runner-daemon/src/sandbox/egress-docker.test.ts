import { randomBytes } from 'node:crypto';
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import Docker from 'dockerode';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { DockerDriver } from './docker-driver.js';
import type { EgressDecision } from './egress.js';
import { sandboxImageWithout } from './fixtures/images.js';
import { ensureSandboxImage } from './image.js';
import { SandboxError, type Sandbox } from './types.js';

/**
 * `network.mode: allowlist` in a real Docker sandbox: the container still has no network device
 * but `lo`; commands get HTTP(S)_PROXY pointing at the relay, which carries their connections to
 * the runner's egress proxy; only the listed hosts are connected.
 */
const runnerId = `rtest-${randomBytes(4).toString('hex')}`;
const docker = new Docker();
const decisions: EgressDecision[] = [];
// The test's upstream listens on this machine's loopback: a private address the runner's operator allows here.
const driver = new DockerDriver({ runnerId, docker, egress: { allowPrivate: true, onDecision: (d) => decisions.push(d) } });
const strict = new DockerDriver({ runnerId, docker });
const sid = (): string => `sess_${randomBytes(8).toString('hex')}`;

let upstream: Server;
let port = 0;

beforeAll(async () => {
  await ensureSandboxImage({ docker });
  upstream = createServer((req, res) => res.end(`upstream saw ${req.method} ${req.url}`));
  await new Promise<void>((resolve) => upstream.listen(0, '127.0.0.1', resolve));
  port = (upstream.address() as AddressInfo).port;
}, 120_000);

afterAll(async () => {
  await driver.reapOrphans(runnerId, []);
  await new Promise((resolve) => upstream?.close(resolve));
});

/** What a command in the sandbox gets from a plain-HTTP GET through its HTTP_PROXY. */
async function getViaProxy(driverOf: DockerDriver, sb: Sandbox, url: string): Promise<string> {
  const script = "const p=process.env.HTTP_PROXY;if(!p){console.log('NO_PROXY_ENV');process.exit(0)}const u=new URL(p);" +
    "require('http').get({host:u.hostname,port:u.port,path:process.argv[1],headers:{host:new URL(process.argv[1]).host}},r=>{let b='';r.on('data',d=>b+=d);r.on('end',()=>console.log(r.statusCode+' '+b.trim()))})" +
    ".on('error',e=>console.log('ERR '+e.code))";
  const r = await driverOf.exec(sb, ['node', '-e', script, url], { timeoutMs: 30_000 });
  return r.stdout.trim();
}

describe('allowlist egress in a docker sandbox', () => {
  it('connects listed hosts only, the container keeping no network device but lo', async () => {
    const session = { id: sid() };
    const sb = await driver.ensure(session, { network_mode: 'allowlist', allowed_hosts: [`127.0.0.1:${port}`], memory_mib: 256 });
    expect((await driver.exec(sb, { script: 'ls /sys/class/net | tr "\\n" " "' })).stdout.trim()).toBe('lo');
    expect((await driver.exec(sb, { script: 'echo $HTTPS_PROXY' })).stdout.trim()).toBe('http://127.0.0.1:3128');
    expect(await getViaProxy(driver, sb, `http://127.0.0.1:${port}/hello`)).toBe('200 upstream saw GET /hello');
    const refused = await getViaProxy(driver, sb, 'http://example.com/');
    expect(refused).toMatch(/^403 agentplane egress: example\.com:80: not in the Environment's allowed_hosts$/);
    expect(decisions.map((d) => d.outcome)).toEqual(['connected', 'refused']);
    const inspected = await docker.getContainer(sb.ref).inspect();
    expect(inspected.HostConfig.NetworkMode).toBe('none');
  }, 120_000);

  it('starts the relay again when the agent kills it, takes a new list on reuse, and drops the proxy for a none Environment', async () => {
    const session = { id: sid() };
    const sb = await driver.ensure(session, { network_mode: 'allowlist', allowed_hosts: ['example.com'], memory_mib: 256 });
    expect(await getViaProxy(driver, sb, `http://127.0.0.1:${port}/x`)).toMatch(/^403 /);
    // The agent kills every process it can see but its own shell: the relay goes too.
    await driver.exec(sb, { script: 'for p in $(ps -eo pid,args | awk \'/[n]ode -e/ {print $1}\'); do kill -9 $p; done; true' });
    const again = await driver.ensure(session, { network_mode: 'allowlist', allowed_hosts: [`127.0.0.1:${port}`], memory_mib: 256 });
    expect(again.reused).toBe(true);
    expect(await getViaProxy(driver, again, `http://127.0.0.1:${port}/y`)).toBe('200 upstream saw GET /y');
    await driver.exec(again, { script: 'for p in $(ps -eo pid,args | awk \'/[n]ode -e/ {print $1}\'); do kill -9 $p; done; true' });
    // No ensure in between (a command of the same Run): the next command starts it again.
    expect(await getViaProxy(driver, again, `http://127.0.0.1:${port}/z`)).toBe('200 upstream saw GET /z');
    const none = await driver.ensure(session, { network_mode: 'none', memory_mib: 256 });
    expect(await getViaProxy(driver, none, `http://127.0.0.1:${port}/w`)).toBe('NO_PROXY_ENV');
    expect((await driver.exec(none, { script: 'ps -eo args | grep -c "[n]ode -e" || true' })).stdout.trim()).toBe('0');
  }, 120_000);

  it("fails the start as the image's fault, not the machine's, when the image has no node for the relay", async () => {
    const { image, remove } = await sandboxImageWithout(docker, 'node');
    const session = { id: sid() };
    try {
      const err = await driver.ensure(session, { image, network_mode: 'allowlist', allowed_hosts: ['example.com'], memory_mib: 256 }).then(() => undefined, (e: unknown) => e);
      expect(err).toBeInstanceOf(SandboxError);
      expect(err).toMatchObject({ reason: 'image_unsuitable' });
      expect((err as Error).message).toMatch(/has no `node` on its PATH, which network mode 'allowlist' needs.*node/);
    } finally {
      await driver.destroy(session.id);
      await remove();
    }
  }, 120_000);

  it('refuses private addresses unless the runner allows them', async () => {
    const session = { id: sid() };
    const sb = await strict.ensure(session, { network_mode: 'allowlist', allowed_hosts: [`127.0.0.1:${port}`], memory_mib: 256 });
    expect(await getViaProxy(strict, sb, `http://127.0.0.1:${port}/`)).toMatch(/^403 .*resolves to a private or reserved address/);
    await strict.destroy(session.id);
  }, 120_000);
});
