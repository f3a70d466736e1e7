import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import { createServer as createHttpsServer } from 'node:https';
import type { AddressInfo } from 'node:net';
import { AgentCard, formatSSEEvent, SSE_HEADERS, TaskState } from '@a2a-js/sdk';
import { DefaultPushNotificationSender, DefaultRequestHandler, InMemoryPushNotificationStore, InMemoryTaskStore, JsonRpcTransportHandler, ServerCallContext, type AgentExecutor } from '@a2a-js/sdk/server';
import { exportJWK, FlattenedSign, generateKeyPair, type CryptoKey } from 'jose';
import { jcsCanonicalize } from '@agentplane/core';

type Json = Record<string, unknown>;

export interface SigningKey {
  kid: string;
  privateKey: CryptoKey;
  /** The public JWK a tool source is configured with. */
  jwk: { kty: 'EC'; crv: 'P-256'; x: string; y: string; kid: string; alg: 'ES256' };
}

export async function signingKey(kid: string): Promise<SigningKey> {
  const { privateKey, publicKey } = await generateKeyPair('ES256', { extractable: true });
  const pub = await exportJWK(publicKey);
  return { kid, privateKey, jwk: { kty: 'EC', crv: 'P-256', x: pub.x!, y: pub.y!, kid, alg: 'ES256' } };
}

/** A card's wire JSON, built through the SDK's AgentCard type (fields the tests vary are overrides). */
export function cardJson(rpcUrl: string, overrides: Json = {}): Json {
  const base = AgentCard.toJSON(AgentCard.fromJSON({
    name: 'peer', description: 'A loopback A2A peer', version: '1',
    supportedInterfaces: [{ url: rpcUrl, protocolBinding: 'JSONRPC', protocolVersion: '1.0' }],
    capabilities: { streaming: false, pushNotifications: false, extensions: [] },
    securitySchemes: { bearer: { httpAuthSecurityScheme: { scheme: 'Bearer' } } },
    securityRequirements: [{ schemes: { bearer: { list: [] } } }],
    defaultInputModes: ['text/plain'], defaultOutputModes: ['text/plain'],
    skills: [
      { id: 'summarize', name: 'Summarize', description: 'Summarizes text', tags: [] },
      { id: 'translate', name: 'Translate', description: 'Translates text', tags: [] },
    ],
  })) as Json;
  return { ...base, ...overrides };
}

/** Adds a detached ES256 JWS over the RFC 8785 form of the card (without `signatures`). */
export async function signCard(card: Json, key: SigningKey): Promise<Json> {
  const { signatures: _old, ...unsigned } = card;
  const jws = await new FlattenedSign(new TextEncoder().encode(jcsCanonicalize(unsigned)))
    .setProtectedHeader({ alg: 'ES256', kid: key.kid, typ: 'JOSE' })
    .sign(key.privateKey);
  return { ...unsigned, signatures: [{ protected: jws.protected, signature: jws.signature }] };
}

export interface CardPeer {
  base: string;
  cardUrl: string;
  rpcUrl: string;
  /** The card the next GET returns. */
  card: Json;
  cardGets: number;
  server: Server;
  close(): Promise<void>;
}

/**
 * HTTPS for a peer: its server certificate and key, and, for mTLS, the CA whose client
 * certificates it asks for (the handshake completes either way, so the card GET needs none; a
 * handler decides on `socket.authorized`).
 */
export interface PeerTls {
  cert: string;
  key: string;
  clientCa?: string | undefined;
}

/** A loopback HTTP (or, with `tls`, HTTPS) server answering the card GET (and, when given, the JSON-RPC POST). */
export async function startCardPeer(rpc?: (req: IncomingMessage, res: ServerResponse) => void, tls?: PeerTls): Promise<CardPeer> {
  const peer = { card: {}, cardGets: 0 } as CardPeer;
  const handle = (req: IncomingMessage, res: ServerResponse) => {
    if (req.method === 'GET' && req.url === '/.well-known/agent-card.json') {
      peer.cardGets += 1;
      res.writeHead(200, { 'content-type': 'application/json' }).end(JSON.stringify(peer.card));
      return;
    }
    if (req.method === 'POST' && req.url === '/a2a' && rpc) return rpc(req, res);
    res.writeHead(404).end();
  };
  const server: Server = tls
    ? createHttpsServer({ cert: tls.cert, key: tls.key, ...(tls.clientCa ? { ca: tls.clientCa, requestCert: true, rejectUnauthorized: false } : {}) }, handle)
    : createServer(handle);
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  const port = (server.address() as AddressInfo).port;
  peer.server = server;
  peer.base = `${tls ? 'https' : 'http'}://127.0.0.1:${port}`;
  peer.cardUrl = `${peer.base}/.well-known/agent-card.json`;
  peer.rpcUrl = `${peer.base}/a2a`;
  peer.close = () => new Promise<void>((r) => { server.closeAllConnections(); server.close(() => r()); });
  return peer;
}

export interface SdkPeer extends CardPeer {
  /** JSON-RPC methods received, in order, with their arrival time. */
  calls: { method: string; at: number; authorization: string | undefined; version: string | undefined }[];
  /** Streams to cut after their first event (the connection is destroyed). */
  dropStreams: number;
  /** Completes every task still working (its result text is `done: <input>`). */
  release(): void;
}

/**
 * A loopback A2A peer built on the SDK's server pieces (`DefaultRequestHandler`,
 * `InMemoryTaskStore`, `JsonRpcTransportHandler`). Its tasks stay `working` until `release()`.
 * `intercept` may answer a JSON-RPC request itself (e.g. a 429 with Retry-After) before the SDK sees it.
 */
export async function startSdkPeer(
  intercept?: (method: string, n: number, res: ServerResponse, req: IncomingMessage) => boolean,
  options: { instant?: boolean; push?: boolean; tls?: PeerTls; card?: (rpcUrl: string) => Json } = {},
): Promise<SdkPeer> {
  let release!: () => void;
  let gate = new Promise<void>((r) => { release = r; });
  const text = (value: string) => ({ content: { $case: 'text' as const, value }, metadata: undefined, filename: '', mediaType: 'text/plain' });
  const executor: AgentExecutor = {
    async execute(ctx, bus) {
      const input = ctx.userMessage.parts.map((p) => (p.content?.$case === 'text' ? p.content.value : '')).join('');
      const base = { id: ctx.taskId, contextId: ctx.contextId, artifacts: [], history: [ctx.userMessage], metadata: undefined };
      bus.publish({ kind: 'task', data: { ...base, status: { state: TaskState.TASK_STATE_WORKING, message: undefined, timestamp: undefined } } });
      if (!options.instant) await gate;
      bus.publish({ kind: 'artifactUpdate', data: { taskId: ctx.taskId, contextId: ctx.contextId, artifact: { artifactId: 'result', name: 'result', description: '', parts: [text(`done: ${input}`)], metadata: undefined, extensions: [] }, append: false, lastChunk: true, metadata: undefined } });
      bus.publish({ kind: 'statusUpdate', data: { taskId: ctx.taskId, contextId: ctx.contextId, status: { state: TaskState.TASK_STATE_COMPLETED, message: undefined, timestamp: undefined }, metadata: undefined } });
      bus.finished();
    },
    async cancelTask() { /* not used */ },
  };
  let sdkCard: AgentCard | undefined;
  const counts = new Map<string, number>();
  let handler: JsonRpcTransportHandler | undefined;
  const peer = (await startCardPeer((req, res) => {
    const chunks: Buffer[] = [];
    req.on('data', (c: Buffer) => chunks.push(c));
    req.on('end', () => {
      void (async () => {
        const body = JSON.parse(Buffer.concat(chunks).toString('utf8')) as Json;
        const method = String(body.method);
        const n = (counts.get(method) ?? 0) + 1;
        counts.set(method, n);
        peer.calls.push({ method, at: Date.now(), authorization: req.headers.authorization, version: req.headers['a2a-version'] as string | undefined });
        if (intercept?.(method, n, res, req)) return;
        sdkCard ??= AgentCard.fromJSON({ ...(options.card ?? ((u: string) => cardJson(u, { capabilities: { streaming: true, pushNotifications: options.push === true, extensions: [] } })))(peer.rpcUrl), signatures: [] });
        if (!handler) {
          const pushStore = options.push ? new InMemoryPushNotificationStore() : undefined;
          const sender = pushStore ? new DefaultPushNotificationSender(pushStore) : undefined;
          handler = new JsonRpcTransportHandler(new DefaultRequestHandler(sdkCard, new InMemoryTaskStore(), executor, undefined, pushStore, sender));
        }
        const out = await handler.handle(body, new ServerCallContext({ requestedVersion: '1.0' }));
        if (Symbol.asyncIterator in out) {
          res.writeHead(200, SSE_HEADERS);
          for await (const ev of out) {
            if (method === 'SendStreamingMessage' && peer.dropStreams > 0) {
              peer.dropStreams -= 1;
              // The first event reaches the client, then the connection drops mid-stream.
              await new Promise<void>((r) => res.write(formatSSEEvent(ev), () => r()));
              res.socket?.destroy();
              return;
            }
            res.write(formatSSEEvent(ev));
          }
          res.end();
          return;
        }
        res.writeHead(200, { 'content-type': 'application/json' }).end(JSON.stringify(out));
      })();
    });
  }, options.tls)) as SdkPeer;
  peer.calls = [];
  peer.dropStreams = 0;
  peer.release = () => {
    release();
    gate = new Promise<void>((r) => { release = r; });
  };
  return peer;
}
