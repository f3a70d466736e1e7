// A local OTLP/HTTP sink for bench:observability, in a process of its own (as a collector is):
// accepts every export and counts requests and bytes. It tells its parent its port once
// listening, and answers `count` with what it received. Each export is answered as a collector
// does, in the request's encoding: an empty ExportTraceServiceResponse, which is no bytes in
// protobuf and `{}` in JSON (a JSON answer to a protobuf export makes the exporter warn on every
// batch, work a real collector does not cause).
import { createServer } from 'node:http';

let requests = 0;
let bytes = 0;
const server = createServer((req, res) => {
  req.on('data', (c: Buffer) => (bytes += c.length));
  req.on('end', () => {
    requests++;
    if (req.headers['content-type'] === 'application/x-protobuf') res.writeHead(200, { 'content-type': 'application/x-protobuf' }).end();
    else res.writeHead(200, { 'content-type': 'application/json' }).end('{}');
  });
});
server.listen(0, '127.0.0.1', () => {
  const address = server.address();
  process.send?.({ kind: 'listening', port: typeof address === 'object' && address ? address.port : 0 });
});
process.on('message', (m: { kind: string }) => {
  if (m.kind === 'count') process.send?.({ kind: 'count', requests, bytes });
});
process.on('disconnect', () => server.close(() => process.exit(0)));
