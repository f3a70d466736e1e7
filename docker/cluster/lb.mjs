// A small TCP load balancer for the API nodes (HTTP, SSE and the runner WebSocket alike):
// each new connection goes to the next upstream in turn; one that refuses is skipped, so the
// clients of a dead node reconnect to a live one. No dependencies beyond Node.
//   LB_PORT=8080 LB_UPSTREAMS=api-1:8080,api-2:8080 node lb.mjs
import { connect, createServer } from 'node:net';

const port = Number(process.env.LB_PORT ?? 8080);
const upstreams = (process.env.LB_UPSTREAMS ?? '').split(',').map((s) => s.trim()).filter(Boolean).map((hp) => {
  const i = hp.lastIndexOf(':');
  return { host: hp.slice(0, i), port: Number(hp.slice(i + 1)) };
});
if (upstreams.length === 0) {
  process.stderr.write('LB_UPSTREAMS is empty (host:port,host:port)\n');
  process.exit(2);
}
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
