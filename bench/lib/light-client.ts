// A cheap HTTP client for load benches: node:http with a keep-alive agent instead of fetch, and a
// bare SSE reader that parses only what it needs. The bench's client is not the product: its CPU
import { wallMs } from './report.js';
// per request should stay small beside the platform's, while still making the same real requests.
import { Agent, request, type IncomingMessage } from 'node:http';
import { SERVICE_VERSION, type ClientOptions } from '@agentplane/client';

export class LightClient {
  private readonly agent = new Agent({ keepAlive: true, maxSockets: 4096 });
  private readonly base: URL;
  private readonly common: Record<string, string>;

  constructor(options: ClientOptions) {
    this.base = new URL(options.baseUrl);
    this.common = {
      ...(options.token ? { authorization: `Bearer ${options.token}` } : {}),
      ...(options.version !== null ? { 'service-version': options.version ?? SERVICE_VERSION } : {}),
      ...(options.workspaceId ? { 'service-workspace-id': options.workspaceId } : {}),
    };
  }

  private open(method: string, path: string, headers: Record<string, string>, body: string | undefined, signal?: AbortSignal): Promise<IncomingMessage> {
    return new Promise((resolve, reject) => {
      const req = request({
        agent: this.agent, host: this.base.hostname, port: this.base.port, method, path: `${this.base.pathname.replace(/\/$/, '')}${path}`,
        headers: { ...this.common, ...headers, ...(body !== undefined ? { 'content-type': 'application/json', 'content-length': String(Buffer.byteLength(body)) } : {}) },
        ...(signal ? { signal } : {}),
      }, resolve);
      req.on('error', reject);
      req.end(body);
    });
  }

  /** POST a JSON body; resolves with the status once the answer is read (throws on >= 400). */
  async post(path: string, body: unknown): Promise<number> {
    const res = await this.open('POST', path, {}, JSON.stringify(body));
    let text = '';
    res.setEncoding('utf8');
    for await (const chunk of res) text += chunk as string;
    if ((res.statusCode ?? 0) >= 400) throw new Error(`POST ${path} answered ${res.statusCode}: ${text}`);
    return res.statusCode ?? 0;
  }

  /**
   * Open an SSE stream and resolve with the time the first event of `type` arrives (an event with
   * an id, whose JSON body's `type` is `type`). Rejects when the stream fails or `signal` aborts.
   */
  async firstOf(path: string, type: string, signal: AbortSignal, onOpen?: () => void): Promise<number> {
    const res = await this.open('GET', path, { accept: 'text/event-stream' }, undefined, signal);
    onOpen?.();
    if (res.statusCode !== 200) {
      res.resume();
      throw new Error(`stream ${path} answered ${res.statusCode}`);
    }
    res.setEncoding('utf8');
    const needle = `"type":"${type}"`;
    let buf = '';
    try {
      for await (const chunk of res) {
        buf += chunk as string;
        let end: number;
        while ((end = buf.indexOf('\n\n')) >= 0) {
          const block = buf.slice(0, end);
          buf = buf.slice(end + 2);
          if (!block.includes(needle)) continue;
          let id = false;
          let data = '';
          for (const line of block.split('\n')) {
            if (line.startsWith('id:')) id = line.length > 3;
            else if (line.startsWith('data:')) data += line.slice(line[5] === ' ' ? 6 : 5);
          }
          if (id && (JSON.parse(data) as { type?: string }).type === type) return wallMs();
        }
      }
    } finally {
      res.destroy();
    }
    throw new Error(`stream ${path} ended before a ${type} event`);
  }

  close(): void {
    this.agent.destroy();
  }
}
