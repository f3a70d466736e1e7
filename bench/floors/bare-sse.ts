// Floor for bench:events (memory per idle SSE connection): a plain node:http server that
// answers every request with SSE headers and a keep-alive comment, nothing else.
import { createServer } from 'node:http';

const server = createServer((req, res) => {
  res.writeHead(200, { 'content-type': 'text/event-stream', 'cache-control': 'no-cache', connection: 'keep-alive' });
  res.write(': ok\n\n');
  req.on('close', () => res.end());
});
server.keepAliveTimeout = 0;
server.listen(0, '127.0.0.1', () => {
  const addr = server.address();
  process.stdout.write(`${typeof addr === 'object' && addr ? addr.port : 0}\n`);
});
process.on('SIGTERM', () => server.close(() => process.exit(0)));
