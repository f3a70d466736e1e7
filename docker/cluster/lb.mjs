// A small TCP load balancer for the API nodes (HTTP, SSE and the runner WebSocket alike):
// each new connection goes to the next upstream in turn; one that refuses is skipped, so the
// clients of a dead node reconnect to a live one. No dependencies beyond Node.
//   LB_PORT=8080 LB_UPSTREAMS=api-1:8080,api-2:8080 node lb.mjs
import { connect, createServer } from 'node:net';

const HELP = `Usage: LB_PORT=8080 LB_UPSTREAMS=api-1:8080,api-2:8080 node lb.mjs

A TCP load balancer for the API nodes: each new connection goes to the next upstream in turn,
skipping one that refuses or does not connect within 3 s.
Environment:
  LB_PORT        the port to listen on, on every address (default 8080)
  LB_UPSTREAMS   the API nodes, host:port separated by commas (required)
`;
const fail = (message) => {
  process.stderr.write(`lb: ${message}\n`);
  process.exit(2);
};
const args = process.argv.slice(2);
if (args.includes('--help') || args.includes('-h')) {
  process.stdout.write(HELP);
  process.exit(0);
}
if (args.length > 0) fail(`unknown argument '${args[0]}' (settings come from the environment: see --help)`);
const portOf = (text, what) => {
  if (!/^[1-9][0-9]{0,4}$/.test(text) || Number(text) > 65535) fail(`${what} must be a port from 1 to 65535, got '${text}'`);
  return Number(text);
};
const port = portOf(process.env.LB_PORT ?? '8080', 'LB_PORT');
const upstreams = (process.env.LB_UPSTREAMS ?? '').split(',').map((s) => s.trim()).filter(Boolean).map((hp) => {
  const i = hp.lastIndexOf(':');
  if (i <= 0) fail(`LB_UPSTREAMS: '${hp}' is not host:port`);
  return { host: hp.slice(0, i), port: portOf(hp.slice(i + 1), `LB_UPSTREAMS: the port of '${hp}'`) };
});
if (upstreams.length === 0) fail('LB_UPSTREAMS is empty (host:port,host:port; see --help)');
let next = 0;

createServer((client) => {
  client.pause();
  client.on('error', () => client.destroy());
  const start = next++ % upstreams.length;
  const attempt = (tried) => {
    if (tried >= upstreams.length) return client.destroy();
    const target = upstreams[(start + tried) % upstreams.length];
    const upstream = connect({ host: target.host, port: target.port });
    upstream.setTimeout(3000, () => upstream.destroy(new Error('connect timeout')));
    upstream.once('error', () => { upstream.destroy(); attempt(tried + 1); });
    upstream.once('connect', () => {
      upstream.setTimeout(0);
      upstream.removeAllListeners('error');
      upstream.on('error', () => client.destroy());
      client.on('close', () => upstream.destroy());
      upstream.on('close', () => client.destroy());
      client.pipe(upstream);
      upstream.pipe(client);
      client.resume();
    });
  };
  attempt(0);
}).listen(port, '0.0.0.0', () => process.stdout.write(`lb listening on ${port} -> ${upstreams.map((u) => `${u.host}:${u.port}`).join(', ')}\n`));

for (const sig of ['SIGTERM', 'SIGINT']) process.on(sig, () => process.exit(0));
