import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { AgentCard } from '@a2a-js/sdk';
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

/** A loopback HTTP server answering the card GET (and, when given, the JSON-RPC POST). */
export async function startCardPeer(rpc?: (req: IncomingMessage, res: ServerResponse) => void): Promise<CardPeer> {
  const peer = { card: {}, cardGets: 0 } as CardPeer;
  const server = createServer((req, res) => {
    if (req.method === 'GET' && req.url === '/.well-known/agent-card.json') {
      peer.cardGets += 1;
      res.writeHead(200, { 'content-type': 'application/json' }).end(JSON.stringify(peer.card));
      return;
    }
    if (req.method === 'POST' && req.url === '/a2a' && rpc) return rpc(req, res);
    res.writeHead(404).end();
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  const port = (server.address() as AddressInfo).port;
  peer.server = server;
  peer.base = `http://127.0.0.1:${port}`;
  peer.cardUrl = `${peer.base}/.well-known/agent-card.json`;
  peer.rpcUrl = `${peer.base}/a2a`;
  peer.close = () => new Promise<void>((r) => { server.closeAllConnections(); server.close(() => r()); });
  return peer;
}
