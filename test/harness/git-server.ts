/**
 * A local git server for tests: bare repositories served over HTTPS with the smart HTTP protocol
 * by `git http-backend` run as a CGI per request, behind a throwaway self-signed certificate.
 * Clients trust it with `GIT_SSL_CAINFO=<caFile>`. Nothing here touches the network beyond
 * 127.0.0.1.
 */
import { execFile, spawn } from 'node:child_process';
import { mkdir, mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { createServer, type Server } from 'node:https';
import type { IncomingMessage, ServerResponse } from 'node:http';
import type { AddressInfo, Socket } from 'node:net';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { promisify } from 'node:util';

const run = promisify(execFile);

export interface BasicAuth {
  username: string;
  password: string;
}

export interface CreateRepoOptions {
  /** The branch the first commit lands on, which is also the repository's default (HEAD). */
  branch?: string;
  /** Lightweight tags pointing at the first commit. */
  tags?: string[];
  /** Require these credentials (HTTP basic) for every request to this repository. */
  auth?: BasicAuth;
  /** Accept every request to this repository and never answer (for timeouts and aborts). */
  stall?: boolean;
}

export interface CommitOptions {
  /** Branch to commit on; defaults to the repository's default branch. Created from it if new. */
  branch?: string;
  tags?: string[];
}

export interface GitServerOptions {
  /**
   * Pass the client's `Git-Protocol` header to http-backend (default true). With false the
   * server only speaks protocol v0, which refuses wants for objects no ref advertises.
   */
  protocolV2?: boolean;
}

export interface GitServer {
  /** `https://127.0.0.1:<port>/<repo>.git`; with `auth`, credentials are embedded in the URL. */
  url(repo: string, auth?: BasicAuth): string;
  /** PEM file of the self-signed certificate, for `GIT_SSL_CAINFO`. */
  caFile: string;
  /** Creates a bare repository with one commit holding `files` (path → content). */
  createRepo(name: string, files: Record<string, string | Buffer>, opts?: CreateRepoOptions): Promise<{ commit: string }>;
  /** Adds or overwrites `files` on top of the branch's tree in a new commit. */
  commit(name: string, files: Record<string, string | Buffer>, opts?: CommitOptions): Promise<{ commit: string }>;
  /** Requests served so far (method and path), for assertions about what a client asked for. */
  requests: Array<{ method: string; path: string; status: number }>;
  close(): Promise<void>;
}

/** Git for the harness itself: no user or system configuration, a fixed identity. */
const GIT_ENV: NodeJS.ProcessEnv = {
  ...process.env,
  GIT_CONFIG_NOSYSTEM: '1',
  GIT_CONFIG_GLOBAL: '/dev/null',
  GIT_TERMINAL_PROMPT: '0',
};
const IDENTITY = ['-c', 'user.name=Test Author', '-c', 'user.email=test@example.invalid', '-c', 'commit.gpgsign=false', '-c', 'tag.gpgsign=false'];

async function git(args: string[], cwd?: string): Promise<string> {
  const { stdout } = await run('git', [...IDENTITY, ...args], { cwd, env: GIT_ENV, maxBuffer: 16 * 1024 * 1024 });
  return stdout.trim();
}

async function selfSignedCertificate(dir: string): Promise<{ key: string; cert: string }> {
  const keyFile = join(dir, 'key.pem');
  const certFile = join(dir, 'cert.pem');
  await run('openssl', [
    'req', '-x509', '-nodes', '-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:prime256v1',
    '-keyout', keyFile, '-out', certFile, '-days', '2', '-subj', '/CN=localhost',
    '-addext', 'subjectAltName=DNS:localhost,IP:127.0.0.1',
  ]);
  return { key: keyFile, cert: certFile };
}

function basicAuthMatches(header: string | undefined, auth: BasicAuth): boolean {
  if (!header?.startsWith('Basic ')) return false;
  const decoded = Buffer.from(header.slice(6), 'base64').toString('utf8');
  return decoded === `${auth.username}:${auth.password}`;
}

/** Splits a CGI response into its header block and the body bytes that followed it. */
function parseCgiHeaders(buf: Buffer): { status: number; headers: Array<[string, string]>; rest: Buffer } | null {
  let end = buf.indexOf('\r\n\r\n');
  let sep = 4;
  const lf = buf.indexOf('\n\n');
  if (lf !== -1 && (end === -1 || lf < end)) {
    end = lf;
    sep = 2;
  }
  if (end === -1) return null;
  let status = 200;
  const headers: Array<[string, string]> = [];
  for (const line of buf.subarray(0, end).toString('latin1').split(/\r?\n/)) {
    const colon = line.indexOf(':');
    if (colon <= 0) continue;
    const name = line.slice(0, colon).trim();
    const value = line.slice(colon + 1).trim();
    if (name.toLowerCase() === 'status') status = Number.parseInt(value, 10) || 500;
    else headers.push([name, value]);
  }
  return { status, headers, rest: buf.subarray(end + sep) };
}

export async function startGitServer(options: GitServerOptions = {}): Promise<GitServer> {
  const protocolV2 = options.protocolV2 ?? true;
  const root = await mkdtemp(join(tmpdir(), 'git-server-'));
  const reposDir = join(root, 'repos');
  const workDir = join(root, 'work');
  await mkdir(reposDir);
  await mkdir(workDir);
  const tls = await selfSignedCertificate(root);
  const backend = join(await git(['--exec-path']), 'git-http-backend');
  const protectedRepos = new Map<string, BasicAuth>();
  const stalledRepos = new Set<string>();
  const defaultBranches = new Map<string, string>();
  const requests: GitServer['requests'] = [];

  const handle = (req: IncomingMessage, res: ServerResponse): void => {
    const url = new URL(req.url ?? '/', 'https://127.0.0.1');
    const repo = /^\/([^/]+)\.git(\/|$)/.exec(url.pathname)?.[1];
    const entry = { method: req.method ?? 'GET', path: url.pathname, status: 0 };
    requests.push(entry);
    const reply = (status: number, headers: Record<string, string> = {}, body = ''): void => {
      entry.status = status;
      res.writeHead(status, { 'Content-Type': 'text/plain', ...headers });
      res.end(body);
    };
    if (repo !== undefined && stalledRepos.has(repo)) {
      req.resume();
      return;
    }
    const auth = repo === undefined ? undefined : protectedRepos.get(repo);
    if (auth && !basicAuthMatches(req.headers.authorization, auth)) {
      reply(401, { 'WWW-Authenticate': 'Basic realm="git"' }, 'authentication required\n');
      req.resume();
      return;
    }
    const env: NodeJS.ProcessEnv = {
      PATH: process.env.PATH,
      GIT_CONFIG_NOSYSTEM: '1',
      GIT_CONFIG_GLOBAL: '/dev/null',
      GIT_PROJECT_ROOT: reposDir,
      GIT_HTTP_EXPORT_ALL: '1',
      GATEWAY_INTERFACE: 'CGI/1.1',
      SERVER_PROTOCOL: `HTTP/${req.httpVersion}`,
      REQUEST_METHOD: req.method ?? 'GET',
      PATH_INFO: decodeURIComponent(url.pathname),
      QUERY_STRING: url.search.slice(1),
      REMOTE_ADDR: req.socket.remoteAddress ?? '127.0.0.1',
    };
    if (auth) env.REMOTE_USER = auth.username;
    if (req.headers['content-type']) env.CONTENT_TYPE = req.headers['content-type'];
    if (req.headers['content-length']) env.CONTENT_LENGTH = req.headers['content-length'];
    // http-backend inflates gzip request bodies itself when told the encoding.
    if (req.headers['content-encoding']) env.HTTP_CONTENT_ENCODING = req.headers['content-encoding'];
    const protocol = req.headers['git-protocol'];
    if (protocolV2 && typeof protocol === 'string') env.GIT_PROTOCOL = protocol;

    const child = spawn(backend, [], { env, stdio: ['pipe', 'pipe', 'pipe'] });
    let head: Buffer | null = Buffer.alloc(0);
    let stderr = '';
    child.stderr.on('data', (d: Buffer) => {
      if (stderr.length < 8192) stderr += d.toString('utf8');
    });
    child.stdout.on('data', (chunk: Buffer) => {
      if (head === null) {
        res.write(chunk);
        return;
      }
      head = Buffer.concat([head, chunk]);
      const parsed = parseCgiHeaders(head);
      if (!parsed) return;
      head = null;
      entry.status = parsed.status;
      res.statusCode = parsed.status;
      for (const [name, value] of parsed.headers) res.appendHeader(name, value);
      if (parsed.rest.length > 0) res.write(parsed.rest);
    });
    child.on('close', () => {
      if (head !== null) {
        reply(502, {}, `http-backend sent no headers: ${stderr}`);
        return;
      }
      res.end();
    });
    child.on('error', (err) => {
      if (!res.headersSent) reply(500, {}, String(err));
      else res.destroy(err);
    });
    child.stdin.on('error', () => undefined);
    req.pipe(child.stdin);
    res.on('close', () => {
      if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL');
    });
  };

  const [key, cert] = await Promise.all([readFile(tls.key), readFile(tls.cert)]);
  const server: Server = createServer({ key, cert }, handle);
  const sockets = new Set<Socket>();
  server.on('connection', (s: Socket) => {
    sockets.add(s);
    s.on('close', () => sockets.delete(s));
  });
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(0, '127.0.0.1', () => resolve());
  });
  const { port } = server.address() as AddressInfo;

  const writeTree = async (dir: string, files: Record<string, string | Buffer>): Promise<void> => {
    for (const [path, content] of Object.entries(files)) {
      const target = join(dir, path);
      await mkdir(dirname(target), { recursive: true });
      await writeFile(target, content);
    }
  };

  const commitFiles = async (name: string, files: Record<string, string | Buffer>, branch: string, tags: string[], message: string): Promise<{ commit: string }> => {
    const work = join(workDir, name);
    const current = await git(['symbolic-ref', '--short', 'HEAD'], work);
    if (current !== branch) {
      const exists = await git(['rev-parse', '--verify', '-q', `refs/heads/${branch}`], work).then(() => true, () => false);
      const base = defaultBranches.get(name) ?? branch;
      await git(exists ? ['checkout', '-q', branch] : ['checkout', '-q', '-b', branch, base], work);
    }
    await writeTree(work, files);
    await git(['add', '-A'], work);
    await git(['commit', '-q', '--allow-empty', '-m', message], work);
    for (const tag of tags) await git(['tag', '-f', tag], work);
    await git(['push', '-q', '--force', 'origin', branch, ...tags.map((t) => `refs/tags/${t}`)], work);
    return { commit: await git(['rev-parse', 'HEAD'], work) };
  };

  return {
    caFile: tls.cert,
    requests,
    url(repo: string, auth?: BasicAuth): string {
      const creds = auth ? `${encodeURIComponent(auth.username)}:${encodeURIComponent(auth.password)}@` : '';
      return `https://${creds}127.0.0.1:${port}/${repo}.git`;
    },
    async createRepo(name, files, opts = {}) {
      if (!/^[A-Za-z0-9][A-Za-z0-9._-]*$/.test(name)) throw new Error(`bad repository name ${name}`);
      const branch = opts.branch ?? 'main';
      const bare = join(reposDir, `${name}.git`);
      await git(['init', '-q', '--bare', '-b', branch, bare]);
      await git(['init', '-q', '-b', branch, join(workDir, name)]);
      await git(['remote', 'add', 'origin', bare], join(workDir, name));
      defaultBranches.set(name, branch);
      if (opts.auth) protectedRepos.set(name, opts.auth);
      const created = await commitFiles(name, files, branch, opts.tags ?? [], 'initial commit');
      if (opts.stall) stalledRepos.add(name);
      return created;
    },
    async commit(name, files, opts = {}) {
      const branch = opts.branch ?? defaultBranches.get(name);
      if (branch === undefined) throw new Error(`unknown repository ${name}`);
      return commitFiles(name, files, branch, opts.tags ?? [], `update ${Object.keys(files).join(', ')}`);
    },
    async close() {
      await new Promise<void>((resolve) => {
        server.close(() => resolve());
        for (const s of sockets) s.destroy();
      });
      await rm(root, { recursive: true, force: true });
    },
  };
}
