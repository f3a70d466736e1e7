import { apiUrl, type WireError } from '@agentplane/core';

export const SERVICE_VERSION = '2026-08-27';

export interface ClientOptions {
  baseUrl: string;
  /** Bearer: an API key, a Principal access credential or a runner credential. */
  token?: string | undefined;
  /** Service-Version header value (default the current version). */
  version?: string | null;
  /** Organization-scoped keys: the workspace to act in. */
  workspaceId?: string | undefined;
}

export interface RequestOptions {
  body?: unknown;
  /** Raw body text (sent as is, for malformed-input tests and passthrough). */
  rawBody?: string | Uint8Array;
  query?: Record<string, string | number | boolean | undefined>;
  headers?: Record<string, string>;
  idempotencyKey?: string;
  signal?: AbortSignal;
}

export interface ApiResponse<T = unknown> {
  status: number;
  headers: Headers;
  body: T;
}

/** A failed call, carrying the wire error body. */
export class ApiCallError extends Error {
  constructor(
    readonly status: number,
    readonly body: WireError | unknown,
  ) {
    const e = (body as WireError | undefined)?.error;
    super(e ? `${status} ${e.type}: ${e.message}` : `HTTP ${status}`);
    this.name = 'ApiCallError';
  }
  get type(): string | undefined {
    return (this.body as WireError | undefined)?.error?.type;
  }
}

/** Thin typed HTTP client: one method per verb, JSON in and out, errors as values or throws. */
export class HttpClient {
  constructor(readonly options: ClientOptions) {}

  with(overrides: Partial<ClientOptions>): HttpClient {
    return new HttpClient({ ...this.options, ...overrides });
  }

  url(path: string, query?: RequestOptions['query']): string {
    // Relative to the base URL, keeping its path (`https://host/agentplane`); an absolute URL as is.
    const u = /^[a-z][a-z0-9+.-]*:/i.test(path) ? new URL(path) : apiUrl(this.options.baseUrl, path);
    for (const [k, v] of Object.entries(query ?? {})) if (v !== undefined) u.searchParams.set(k, String(v));
    return u.toString();
  }

  headers(extra: Record<string, string> = {}, json = false): Record<string, string> {
    const h: Record<string, string> = {};
    if (this.options.token) h.authorization = `Bearer ${this.options.token}`;
    const version = this.options.version === undefined ? SERVICE_VERSION : this.options.version;
    if (version !== null) h['service-version'] = version;
    if (this.options.workspaceId) h['service-workspace-id'] = this.options.workspaceId;
    if (json) h['content-type'] = 'application/json';
    return { ...h, ...extra };
  }

  /** Send a request; never throws for HTTP statuses (see `call` for the throwing form). */
  async request<T = unknown>(method: string, path: string, opts: RequestOptions = {}): Promise<ApiResponse<T>> {
    const hasBody = opts.body !== undefined || opts.rawBody !== undefined;
    const extra = { ...(opts.headers ?? {}) };
    if (opts.idempotencyKey !== undefined) extra['idempotency-key'] = opts.idempotencyKey;
    const res = await fetch(this.url(path, opts.query), {
      method,
      headers: this.headers(extra, hasBody),
      body: opts.rawBody ?? (opts.body !== undefined ? JSON.stringify(opts.body) : undefined),
      signal: opts.signal ?? null,
    });
    const text = await res.text();
    let body: unknown = text;
    if (text.length > 0 && (res.headers.get('content-type') ?? '').includes('json')) body = JSON.parse(text) as unknown;
    return { status: res.status, headers: res.headers, body: body as T };
  }

  async call<T = unknown>(method: string, path: string, opts: RequestOptions = {}): Promise<T> {
    const r = await this.request<T>(method, path, opts);
    if (r.status >= 400) throw new ApiCallError(r.status, r.body);
    return r.body;
  }

  /**
   * `POST /v1/files`: uploads one File as `multipart/form-data` (part `file`). Never throws for
   * HTTP statuses; the File head is the body of a 201.
   */
  async uploadFile<T = unknown>(
    filename: string,
    content: Uint8Array | Blob,
    opts: { contentType?: string; idempotencyKey?: string; signal?: AbortSignal } = {},
  ): Promise<ApiResponse<T>> {
    const form = new FormData();
    const blob = content instanceof Blob ? content : new Blob([content], { type: opts.contentType ?? 'application/octet-stream' });
    form.set('file', blob, filename);
    const extra: Record<string, string> = {};
    if (opts.idempotencyKey !== undefined) extra['idempotency-key'] = opts.idempotencyKey;
    const res = await fetch(this.url('/v1/files'), { method: 'POST', headers: this.headers(extra), body: form, signal: opts.signal ?? null });
    const text = await res.text();
    const body: unknown = text.length > 0 && (res.headers.get('content-type') ?? '').includes('json') ? JSON.parse(text) : text;
    return { status: res.status, headers: res.headers, body: body as T };
  }

  /** `GET /v1/files/{file_id}/content`: the File's bytes (throws ApiCallError on an error status). */
  async downloadFile(fileId: string, opts: { signal?: AbortSignal } = {}): Promise<Uint8Array> {
    const res = await fetch(this.url(`/v1/files/${encodeURIComponent(fileId)}/content`), { headers: this.headers(), signal: opts.signal ?? null });
    if (res.status >= 400) {
      const text = await res.text();
      throw new ApiCallError(res.status, (res.headers.get('content-type') ?? '').includes('json') ? JSON.parse(text) : text);
    }
    return new Uint8Array(await res.arrayBuffer());
  }

  get<T = unknown>(path: string, query?: RequestOptions['query']): Promise<T> {
    return this.call<T>('GET', path, { query });
  }
  post<T = unknown>(path: string, body?: unknown, opts: Omit<RequestOptions, 'body'> = {}): Promise<T> {
    return this.call<T>('POST', path, { ...opts, body: body ?? {} });
  }
  patch<T = unknown>(path: string, body: unknown, opts: Omit<RequestOptions, 'body'> = {}): Promise<T> {
    return this.call<T>('PATCH', path, { ...opts, body });
  }
  delete<T = unknown>(path: string, opts: RequestOptions = {}): Promise<T> {
    return this.call<T>('DELETE', path, opts);
  }
}
