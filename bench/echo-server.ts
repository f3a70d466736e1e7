/** The floor for bench/fleet.ts: a bare `ws` server that echoes every frame. */
import { createServer } from 'node:http';
import { WebSocketServer } from 'ws';

const server = createServer();
const wss = new WebSocketServer({ server, perMessageDeflate: false, maxPayload: 1024 * 1024 });
wss.on('connection', (ws) => ws.on('message', (d, isBinary) => ws.send(d, { binary: isBinary })));
server.listen(0, '127.0.0.1', () => {
  const a = server.address();
  process.send?.({ kind: 'up', port: typeof a === 'object' && a ? a.port : 0 });
});
process.on('SIGTERM', () => process.exit(0));
