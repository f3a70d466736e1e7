// A cheap HTTP/1.1 client for load benches: plain TCP sockets, each request written in one piece,
// answers read with a minimal parser (status, content-length or chunked framing, `connection:
// close`), and a bare SSE reader that parses only what it needs. The bench's client is not the
// product: it shares the machine's cores with the platform it measures, so its CPU per request
// should stay small beside the platform's (node:http's client cost about as much per Run as the
// scheduler), while it still makes the same real requests.
import { connect, type Socket } from 'node:net';
import { SERVICE_VERSION, type ClientOptions } from '@agentplane/client';
import { wallMs } from './report.js';

/** An answer being read off one socket (bytes kept as latin1 text: one character a byte). */
class Answer {
  status = 0;
  private head = true;
  private buf = '';
  private length = -1;
  private chunked = false;
  private chunkLeft = -1;
  close = false;
  /** The body read so far (complete once `done`). */
  body = '';
  done = false;

  constructor(private readonly onHead?: (a: Answer) => void, private readonly onBody?: (text: string) => void) {}

  /** Feeds bytes; returns true once the whole answer is in. Throws on a malformed answer. */
  feed(text: string): boolean {
    this.buf += text;
    if (this.head) {
      const end = this.buf.indexOf('\r\n\r\n');
      if (end < 0) return false;
      const lines = this.buf.slice(0, end).split('\r\n');
      this.buf = this.buf.slice(end + 4);
      this.head = false;
      const m = /^HTTP\/1\.[01] (\d{3})/.exec(lines[0] ?? '');
      if (!m) throw new Error(`not an HTTP answer: ${(lines[0] ?? '').slice(0, 80)}`);
      this.status = Number(m[1]);
      for (let i = 1; i < lines.length; i++) {
        const line = lines[i] as string;
        const colon = line.indexOf(':');
        const name = line.slice(0, colon).toLowerCase();
        const value = line.slice(colon + 1).trim().toLowerCase();
        if (name === 'content-length') this.length = Number(value);
        else if (name === 'transfer-encoding') this.chunked = value.includes('chunked');
        else if (name === 'connection') this.close = value === 'close';
      }
      this.onHead?.(this);
      if (!this.chunked && this.length < 0) this.length = this.status === 204 || this.status === 304 ? 0 : -1;
    }
    if (this.chunked) return this.dechunk();
    if (this.length < 0) {
      // Read to the end of the connection.
      this.take(this.buf);
      this.buf = '';
      return false;
    }
    const n = Math.min(this.length - this.body.length, this.buf.length);
    this.take(this.buf.slice(0, n));
    this.buf = this.buf.slice(n);
    this.done = this.body.length >= this.length;
    return this.done;
  }

  private take(text: string): void {
    if (text.length === 0) return;
    if (this.onBody) this.onBody(text);
    else this.body += text;
  }

  private dechunk(): boolean {
    for (;;) {
      if (this.chunkLeft < 0) {
        const eol = this.buf.indexOf('\r\n');
        if (eol < 0) return false;
        this.chunkLeft = parseInt(this.buf.slice(0, eol), 16);
        if (!Number.isFinite(this.chunkLeft)) throw new Error('malformed chunked body');
        this.buf = this.buf.slice(eol + 2);
        if (this.chunkLeft === 0) {
          // Last chunk: no trailers are sent by the API, only the final CRLF.
          this.done = true;
          return true;
        }
      }
      if (this.chunkLeft > 0) {
        const n = Math.min(this.chunkLeft, this.buf.length);
        if (n === 0) return false;
        this.take(this.buf.slice(0, n));
        this.buf = this.buf.slice(n);
        this.chunkLeft -= n;
        if (this.chunkLeft > 0) return false;
      }
      if (this.buf.length < 2) return false;
      this.buf = this.buf.slice(2); // the chunk's CRLF
      this.chunkLeft = -1;
    }
  }
}

/** A socket and whoever is reading from it now. */
interface Conn {
  socket: Socket;
  reader?: (text: string) => void;
  onEnd?: (err?: Error) => void;
}

export class LightClient {
  private readonly host: string;
  private readonly port: number;
  private readonly prefix: string;
  private readonly common: string;
  private readonly idle: Conn[] = [];
  private readonly open = new Set<Conn>();

  constructor(options: ClientOptions) {
    const base = new URL(options.baseUrl);
    this.host = base.hostname;
    this.port = Number(base.port || 80);
    this.prefix = base.pathname.replace(/\/$/, '');
    this.common = [
      `host: ${base.host}`,
      ...(options.token ? [`authorization: Bearer ${options.token}`] : []),
      ...(options.version !== null ? [`service-version: ${options.version ?? SERVICE_VERSION}`] : []),
      ...(options.workspaceId ? [`service-workspace-id: ${options.workspaceId}`] : []),
    ].join('\r\n');
  }

  private connect(): Promise<Conn> {
    return new Promise((resolve, reject) => {
      const socket = connect({ host: this.host, port: this.port, noDelay: true });
      const conn: Conn = { socket };
      socket.setEncoding('latin1');
      socket.on('data', (text: string) => conn.reader?.(text));
      const ended = (err?: Error) => {
        this.open.delete(conn);
        const i = this.idle.indexOf(conn);
        if (i >= 0) this.idle.splice(i, 1);
        const onEnd = conn.onEnd;
        conn.onEnd = undefined;
        conn.reader = undefined;
        onEnd?.(err ?? new Error('connection closed'));
      };
      socket.once('connect', () => {
        this.open.add(conn);
        resolve(conn);
      });
      socket.on('error', (err) => {
        if (!this.open.has(conn)) reject(err);
        ended(err);
      });
      socket.on('close', () => ended());
    });
  }

  /** Sends one request on `conn` and reads its answer (the body, unless `onBody` takes it). */
  private exchange(conn: Conn, request: string, answer: Answer, signal?: AbortSignal): Promise<Answer> {
    return new Promise((resolve, reject) => {
      const abort = () => {
        conn.socket.destroy();
        reject(new Error('aborted'));
      };
      if (signal?.aborted) return abort();
      signal?.addEventListener('abort', abort, { once: true });
      const finish = (err?: Error) => {
        signal?.removeEventListener('abort', abort);
        conn.reader = undefined;
        conn.onEnd = undefined;
        if (err) reject(err);
        else resolve(answer);
      };
      conn.reader = (text) => {
        try {
          if (answer.feed(text)) finish();
        } catch (err) {
          conn.socket.destroy();
          finish(err as Error);
        }
      };
      conn.onEnd = (err) => finish(err);
      conn.socket.write(request, 'latin1');
    });
  }

  /** POST a JSON body; resolves with the status once the answer is read (throws on >= 400). */
  async post(path: string, body: unknown): Promise<number> {
    const text = Buffer.from(JSON.stringify(body), 'utf8').toString('latin1');
    const request = `POST ${this.prefix}${path} HTTP/1.1\r\n${this.common}\r\ncontent-type: application/json\r\ncontent-length: ${text.length}\r\n\r\n${text}`;
    for (let attempt = 0; ; attempt++) {
      const reused = this.idle.pop();
      const conn = reused ?? (await this.connect());
      let answer: Answer;
      try {
        answer = await this.exchange(conn, request, new Answer());
      } catch (err) {
        // A kept-alive socket the server closed while idle: once more on a new one.
        if (reused && attempt === 0) continue;
        throw err;
      }
      if (answer.close) conn.socket.destroy();
      else this.idle.push(conn);
      if (answer.status >= 400) throw new Error(`POST ${path} answered ${answer.status}: ${Buffer.from(answer.body, 'latin1').toString('utf8')}`);
      return answer.status;
    }
  }

  /**
   * Open an SSE stream and resolve with the time the first event of `type` arrives (an event with
   * an id, whose JSON body's `type` is `type`). Rejects when the stream fails or `signal` aborts.
   */
  async firstOf(path: string, type: string, signal: AbortSignal, onOpen?: () => void): Promise<number> {
    const conn = await this.connect();
    const needle = `"type":"${type}"`;
    let buf = '';
    let at = 0;
    let failed: Error | undefined;
    const answer = new Answer(
      (a) => {
        onOpen?.();
        if (a.status !== 200) failed = new Error(`stream ${path} answered ${a.status}`);
      },
      (text) => {
        if (failed || at) return;
        buf += text;
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
          if (id && (JSON.parse(Buffer.from(data, 'latin1').toString('utf8')) as { type?: string }).type === type) {
            at = wallMs();
            // Done: hang up, as a viewer that saw what it waited for does.
            conn.socket.destroy();
            return;
          }
        }
      },
    );
    try {
      await this.exchange(conn, `GET ${this.prefix}${path} HTTP/1.1\r\n${this.common}\r\naccept: text/event-stream\r\n\r\n`, answer, signal);
    } catch (err) {
      if (at) return at;
      throw failed ?? err;
    } finally {
      conn.socket.destroy();
    }
    if (at) return at;
    throw failed ?? new Error(`stream ${path} ended before a ${type} event`);
  }

  close(): void {
    for (const c of [...this.open]) c.socket.destroy();
    this.idle.length = 0;
  }
}
