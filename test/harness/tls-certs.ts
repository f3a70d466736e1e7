import { execFileSync } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

export interface TestPki {
  /** PEM of the test CA (server and client certificates are issued by it). */
  ca: string;
  /** A file holding the CA PEM (for NODE_EXTRA_CA_CERTS). */
  caFile: string;
  server: { cert: string; key: string };
  client: { cert: string; key: string };
  /** A client certificate from another CA, which the peer does not accept. */
  stranger: { cert: string; key: string };
  dispose(): void;
}

/**
 * A throwaway PKI made with the openssl CLI: a CA, a server certificate for 127.0.0.1 and a
 * client certificate, all EC P-256, valid one day.
 */
export function makeTestPki(): TestPki {
  const dir = mkdtempSync(join(tmpdir(), 'agentplane-pki-'));
  const f = (n: string) => join(dir, n);
  const ssl = (...args: string[]) => execFileSync('openssl', args, { cwd: dir, stdio: ['ignore', 'ignore', 'pipe'] });
  const key = (name: string) => ssl('ecparam', '-name', 'prime256v1', '-genkey', '-noout', '-out', f(`${name}.key`));
  const ca = (name: string) => {
    key(name);
    ssl('req', '-x509', '-new', '-key', f(`${name}.key`), '-sha256', '-days', '1', '-subj', `/CN=${name}`, '-out', f(`${name}.pem`),
      '-addext', 'basicConstraints=critical,CA:TRUE', '-addext', 'keyUsage=critical,keyCertSign,cRLSign');
  };
  const issue = (name: string, by: string, ext: string) => {
    key(name);
    ssl('req', '-new', '-key', f(`${name}.key`), '-subj', `/CN=${name}`, '-out', f(`${name}.csr`));
    writeFileSync(f(`${name}.ext`), ext);
    ssl('x509', '-req', '-in', f(`${name}.csr`), '-CA', f(`${by}.pem`), '-CAkey', f(`${by}.key`), '-CAcreateserial', '-days', '1', '-sha256', '-extfile', f(`${name}.ext`), '-out', f(`${name}.pem`));
  };
  ca('test-ca');
  ca('other-ca');
  issue('server', 'test-ca', 'subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n');
  issue('client', 'test-ca', 'extendedKeyUsage=clientAuth\n');
  issue('stranger', 'other-ca', 'extendedKeyUsage=clientAuth\n');
  const read = (n: string) => readFileSync(f(n), 'utf8');
  const pair = (n: string) => ({ cert: read(`${n}.pem`), key: read(`${n}.key`) });
  const caFile = join(tmpdir(), `agentplane-ca-${process.pid}-${Date.now()}.pem`);
  writeFileSync(caFile, read('test-ca.pem'));
  const out: TestPki = {
    ca: read('test-ca.pem'), caFile, server: pair('server'), client: pair('client'), stranger: pair('stranger'),
    dispose: () => rmSync(caFile, { force: true }),
  };
  rmSync(dir, { recursive: true, force: true });
  return out;
}
