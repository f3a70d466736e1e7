/**
 * A TCP proxy in front of the platform so a test can cut every open connection (a dropped
 * stream, as a flaky network does) and see what the client sends when it comes back.
 */
import { connect, createServer, type Socket } from 'node:net';

export interface TcpProxy {
  port: number;
  url: string;
  /** The request head (first bytes) of every connection, lower-cased. */
  heads: string[];
  /** Destroy every open connection in both directions. */
  dropAll(): number;
  close(): Promise<void>;
}

export async function startTcpProxy(targetPort: number): Promise<TcpProxy> {
  const open = new Set<Socket>();
  const heads: string[] = [];
  const server = createServer((client) => {
    const upstream = connect(targetPort, '127.0.0.1');
    open.add(client);
    open.add(upstream);
    const forget = () => { open.delete(client); open.delete(upstream); client.destroy(); upstream.destroy(); };
    client.on('close', forget).on('error', forget);
    upstream.on('close', forget).on('error', forget);
    client.on('data', (chunk: Buffer) => {
      const text = chunk.toString('latin1');
      if (/^(GET|POST|HEAD|PUT|PATCH|DELETE) /.test(text)) heads.push(text.slice(0, 4096).toLowerCase());
    });
    client.pipe(upstream);
    upstream.pipe(client);
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const addr = server.address();
  const port = typeof addr === 'object' && addr ? addr.port : 0;
  return {
    port,
    url: `http://127.0.0.1:${port}`,
    heads,
    dropAll() {
      const n = open.size;
      for (const s of open) s.destroy();
      open.clear();
      return n;
    },
    close: () => new Promise<void>((resolve) => { for (const s of open) s.destroy(); server.close(() => resolve()); }),
  };
}
