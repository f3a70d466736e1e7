/**
 * Sandbox preflight for `doctor`: proves on this machine, with a real throwaway sandbox, that each
 * default the runner reports actually holds — instead of assuming it from the Docker version.
 */
import { randomBytes } from 'node:crypto';
import Docker from 'dockerode';
import { dockerAvailable } from '@agentplane/sandbox';
import { DockerDriver } from './docker-driver.js';
import { ensureSandboxImage, imageExists, loadManifest } from './image.js';

export interface PreflightCheck {
  name: string;
  ok: boolean;
  detail: string;
  durationMs: number;
}

export interface PreflightReport {
  ok: boolean;
  checks: PreflightCheck[];
}

export async function sandboxPreflight(options: { docker?: Docker; runnerId?: string; buildImage?: boolean } = {}): Promise<PreflightReport> {
  const docker = options.docker ?? new Docker();
  const checks: PreflightCheck[] = [];
  const check = async (name: string, fn: () => Promise<string>): Promise<boolean> => {
    const started = Date.now();
    try {
      const detail = await fn();
      checks.push({ name, ok: true, detail, durationMs: Date.now() - started });
      return true;
    } catch (err) {
      checks.push({ name, ok: false, detail: err instanceof Error ? err.message : String(err), durationMs: Date.now() - started });
      return false;
    }
  };
  const done = (): PreflightReport => ({ ok: checks.every((c) => c.ok), checks });

  if (!(await check('docker reachable', async () => {
    if (!(await dockerAvailable(docker))) throw new Error('dockerd does not answer on its socket');
    const info = await docker.version();
    return `Docker ${info.Version}`;
  }))) return done();

  if (!(await check('sandbox image', async () => {
    if (options.buildImage === false) {
      const latest = `${loadManifest().repository}:latest`;
      if (!(await imageExists(docker, latest))) throw new Error(`${latest} is missing: run npm run build:sandbox-image`);
      return `${latest} present`;
    }
    const image = await ensureSandboxImage({ docker });
    return `${image.tag} (${image.built ? 'built now' : 'present'})`;
  }))) return done();

  const runnerId = options.runnerId ?? 'preflight';
  const driver = new DockerDriver({ runnerId, docker });
  // Leftovers of an earlier preflight that was killed half-way.
  await driver.reapOrphans(runnerId, []).catch(() => []);
  const session = { id: `preflight-${randomBytes(6).toString('hex')}` };
  try {
    let sandbox: Awaited<ReturnType<DockerDriver['ensure']>> | undefined;
    if (!(await check('hardened sandbox starts', async () => {
      sandbox = await driver.ensure(session, { memory_mib: 128, pids_limit: 64 });
      return 'no network, uid 10001, all capabilities dropped, read-only root';
    })) || !sandbox) return done();
    const sb = sandbox;
    const run = async (script: string): Promise<{ exitCode: number; stdout: string; stderr: string }> => driver.exec(sb, { script }, { timeoutMs: 10_000 });
    await check('network isolation', async () => {
      const r = await run('ls /sys/class/net; exec 3<>/dev/tcp/1.1.1.1/53 && echo CONNECTED');
      if (r.stdout.includes('CONNECTED') || r.stdout.trim() !== 'lo') throw new Error(`sandbox reached the network (interfaces: ${r.stdout.trim()})`);
      return 'only loopback; connect attempts fail';
    });
    await check('non-root, no capabilities, no-new-privileges', async () => {
      const r = await run('id -u; grep -E "^(CapEff|NoNewPrivs)" /proc/self/status');
      if (!/^10001\n/.test(r.stdout) || !/CapEff:\s+0+\n/.test(r.stdout) || !/NoNewPrivs:\s+1/.test(r.stdout)) throw new Error(r.stdout.trim());
      return 'uid 10001, CapEff 0, NoNewPrivs 1';
    });
    await check('read-only root, writable workspace', async () => {
      const r = await run('touch /usr/bin/probe 2>/dev/null && echo ROOT_WRITABLE; echo ok > /workspace/.probe && cat /workspace/.probe && rm /workspace/.probe');
      if (r.stdout.includes('ROOT_WRITABLE') || !r.stdout.includes('ok')) throw new Error(r.stdout.trim() || r.stderr.trim());
      return 'root read-only; /workspace writable';
    });
    await check('bounded cancel', async () => {
      const controller = new AbortController();
      const started = Date.now();
      setTimeout(() => controller.abort(), 200);
      const r = await driver.exec(sb, ['sleep', '600'], { signal: controller.signal });
      const took = Date.now() - started;
      if (!r.killed || took > 5_000) throw new Error(`cancel took ${took} ms`);
      return `sleep 600 killed in ${took} ms`;
    });
    await check('egress allowlist relay', async () => {
      // The same sandbox as an allowlist Environment's: the relay starts and the runner's proxy
      // answers it. The host asked for is not listed, so nothing leaves this machine.
      const allowlisted = await driver.ensure(session, { memory_mib: 128, pids_limit: 64, network_mode: 'allowlist', allowed_hosts: ['preflight.invalid'] });
      const script = "const u=new URL(process.env.HTTPS_PROXY);const s=require('net').connect(u.port,u.hostname,()=>s.write('CONNECT elsewhere.invalid:443 HTTP/1.1\\r\\n\\r\\n'));" +
        "let b='';s.on('data',d=>b+=d);s.on('close',()=>console.log(b.split('\\r\\n')[0]));s.on('error',e=>console.log('ERR '+e.code))";
      const r = await driver.exec(allowlisted, ['node', '-e', script], { timeoutMs: 10_000 });
      if (r.stdout.trim() !== 'HTTP/1.1 403 Forbidden') throw new Error(`the egress proxy answered ${JSON.stringify(r.stdout.trim() || r.stderr.trim())}, not a refusal of an unlisted host`);
      const net = await driver.exec(allowlisted, { script: 'ls /sys/class/net' }, { timeoutMs: 10_000 });
      if (net.stdout.trim() !== 'lo') throw new Error(`an allowlist sandbox has a network device (${net.stdout.trim()})`);
      return 'relay started; an unlisted host refused (403); only loopback';
    });
  } finally {
    await check('teardown', async () => {
      await driver.destroy(session.id);
      const left = await docker.listContainers({ all: true, filters: JSON.stringify({ label: [`agentplane.session=${session.id}`] }) });
      if (left.length > 0) throw new Error('sandbox container still present');
      return 'container and workspace removed';
    });
  }
  return done();
}
