/**
 * The JSON-RPC surface of `POST /v1/mcp`: protocol versions, error codes, message shapes.
 * The contract fixes these values (Versioning item 4, Errors "MCP"); nothing here is negotiable.
 */

/** Protocol revisions served on the legacy (initialize handshake) shape. */
export const LEGACY_VERSIONS = ['2025-11-25', '2025-06-18'] as const;
/** What an `initialize` naming an unsupported version is answered with. */
export const LEGACY_FALLBACK_VERSION = '2025-06-18';
/** The stateless per-request-envelope revision. */
export const MODERN_VERSION = '2026-07-28';
/** Every revision this endpoint serves, newest first (listed by -32022 and server/discover). */
export const SUPPORTED_VERSIONS: readonly string[] = [MODERN_VERSION, ...LEGACY_VERSIONS];

export const META_PROTOCOL_VERSION = 'io.modelcontextprotocol/protocolVersion';
export const META_CLIENT_CAPABILITIES = 'io.modelcontextprotocol/clientCapabilities';
export const META_CLIENT_INFO = 'io.modelcontextprotocol/clientInfo';
export const META_SERVER_INFO = 'io.modelcontextprotocol/serverInfo';

export const HEADER_PROTOCOL_VERSION = 'mcp-protocol-version';
export const HEADER_METHOD = 'mcp-method';
export const HEADER_NAME = 'mcp-name';

export const ErrorCode = {
  ParseError: -32700,
  InvalidRequest: -32600,
  MethodNotFound: -32601,
  InvalidParams: -32602,
  InternalError: -32603,
  /** Designed: the bearer is missing, unknown, revoked or for another audience (the body of a 401). */
  Unauthorized: -32001,
  /** Designed: the key's rate limit is reached (HTTP 429 with Retry-After; `data` = the wire error body). */
  RateLimited: -32029,
  /** `HeaderMismatchError`: `MCP-Protocol-Version`, `Mcp-Method` or `Mcp-Name` disagree with the body. */
  HeaderMismatch: -32020,
  /** `UnsupportedProtocolVersionError`: an unserved `_meta` protocol version. */
  UnsupportedProtocolVersion: -32022,
} as const;

/** 4 MiB: the ceiling of one JSON-RPC request body and of one final response. */
export const MAX_MESSAGE_BYTES = 4 * 1024 * 1024;
/** 1 MiB: the ceiling of one synthesized REST result inside a tool result, before framing. */
export const MAX_RESULT_CONTRIBUTION_BYTES = 1024 * 1024;

export type JsonRpcId = string | number | null;

export interface JsonRpcRequest {
  jsonrpc: '2.0';
  id?: string | number;
  method: string;
  params?: Record<string, unknown>;
}

export interface JsonRpcErrorObject {
  code: number;
  message: string;
  data?: unknown;
}

export type JsonRpcResponse =
  | { jsonrpc: '2.0'; id: JsonRpcId; result: Record<string, unknown> }
  | { jsonrpc: '2.0'; id: JsonRpcId; error: JsonRpcErrorObject };

/** A protocol failure: the JSON-RPC error to answer with and the HTTP status that frames it. */
export class McpProtocolError extends Error {
  constructor(
    readonly code: number,
    message: string,
    readonly httpStatus: number = 200,
    readonly data?: unknown,
  ) {
    super(message);
    this.name = 'McpProtocolError';
  }

  toObject(): JsonRpcErrorObject {
    return this.data === undefined ? { code: this.code, message: this.message } : { code: this.code, message: this.message, data: this.data };
  }
}

export const rpcResult = (id: JsonRpcId, result: Record<string, unknown>): JsonRpcResponse => ({ jsonrpc: '2.0', id, result });
export const rpcError = (id: JsonRpcId, error: JsonRpcErrorObject): JsonRpcResponse => ({ jsonrpc: '2.0', id, error });

const isPlainObject = (v: unknown): v is Record<string, unknown> => typeof v === 'object' && v !== null && !Array.isArray(v);

/** Validate the JSON-RPC 2.0 envelope of one message (batches were removed in 2025-06-18 and are refused). */
export function parseMessage(body: unknown): JsonRpcRequest {
  if (Array.isArray(body)) throw new McpProtocolError(ErrorCode.InvalidRequest, 'JSON-RPC batches are not accepted', 400);
  if (!isPlainObject(body) || body.jsonrpc !== '2.0' || typeof body.method !== 'string' || body.method.length === 0) {
    throw new McpProtocolError(ErrorCode.InvalidRequest, 'not a JSON-RPC 2.0 request or notification', 400);
  }
  const id = body.id;
  if (id !== undefined && typeof id !== 'string' && !(typeof id === 'number' && Number.isInteger(id))) {
    throw new McpProtocolError(ErrorCode.InvalidRequest, 'the JSON-RPC id must be a string or an integer', 400);
  }
  return body as unknown as JsonRpcRequest;
}

/** A request's params are named (an object); by-position params are invalid params (-32602), answered under its id. */
export function checkParams(msg: JsonRpcRequest): void {
  const params: unknown = msg.params;
  if (params !== undefined && !isPlainObject(params)) throw new McpProtocolError(ErrorCode.InvalidParams, 'params must be an object (named parameters)', 400);
}

/** `Mcp-Name` may carry a Base64 sentinel (`=?base64?...?=`) for values that are not plain header text. */
export function decodeHeaderValue(value: string): string {
  const m = /^=\?base64\?([A-Za-z0-9+/=]*)\?=$/.exec(value.trim());
  return m ? Buffer.from(m[1] ?? '', 'base64').toString('utf8') : value.trim();
}

export { isPlainObject };
