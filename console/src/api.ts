/**
 * The console's API client: openapi-fetch typed by the generated `paths` (from the API's own
 * OpenAPI document). The credential lives in sessionStorage only; it is sent as a bearer
 * header, never put in a URL, and never logged.
 */
import createClient, { type Client } from 'openapi-fetch';
import type { paths } from './generated/api';
import { SERVICE_VERSION } from './generated/version';

export { SERVICE_VERSION };

export interface Auth {
  token: string;
  /** Service-Workspace-Id for organization-scoped keys (null: the key's own or default workspace). */
  workspaceId: string | null;
}

const STORAGE_KEY = 'agentplane.console.auth';

export function loadAuth(): Auth | null {
  try {
    const raw = sessionStorage.getItem(STORAGE_KEY);
    if (!raw) return null;
    const v = JSON.parse(raw) as Partial<Auth>;
    return typeof v.token === 'string' ? { token: v.token, workspaceId: typeof v.workspaceId === 'string' ? v.workspaceId : null } : null;
  } catch {
    return null;
  }
}

export function saveAuth(auth: Auth): void {
  sessionStorage.setItem(STORAGE_KEY, JSON.stringify(auth));
}

export function clearAuth(): void {
  sessionStorage.removeItem(STORAGE_KEY);
}

export type ApiClient = Client<paths>;

export function authHeaders(auth: Auth): Record<string, string> {
  const h: Record<string, string> = { authorization: `Bearer ${auth.token}`, 'service-version': SERVICE_VERSION };
  if (auth.workspaceId) h['service-workspace-id'] = auth.workspaceId;
  return h;
}

export function makeClient(auth: Auth): ApiClient {
  const client = createClient<paths>({ baseUrl: location.origin });
  client.use({
    onRequest({ request }) {
      for (const [k, v] of Object.entries(authHeaders(auth))) request.headers.set(k, v);
      return request;
    },
  });
  return client;
}

/** A failed call: the wire error `{error: {type, message}}` or the HTTP status. */
export class ApiProblem extends Error {
  constructor(readonly status: number, readonly type: string, message: string) {
    super(message);
    this.name = 'ApiProblem';
  }
}

interface Outcome<T> {
  data?: T;
  error?: unknown;
  response: Response;
}

/** Unwrap an openapi-fetch result: the data, or throw an ApiProblem with the wire error. */
export async function ok<T>(call: Promise<Outcome<T>>): Promise<T> {
  const r = await call;
  if (r.error !== undefined || !r.response.ok) {
    const e = (r.error as { error?: { type?: string; message?: string } } | undefined)?.error;
    throw new ApiProblem(r.response.status, e?.type ?? 'http', e?.message ?? `HTTP ${r.response.status}`);
  }
  return r.data as T;
}

export function describeError(err: unknown): string {
  if (err instanceof ApiProblem) return `${err.type}: ${err.message}`;
  return err instanceof Error ? err.message : String(err);
}

/** A fresh Idempotency-Key for one user action (a retry of the same action reuses it). */
export function idempotencyKey(): string {
  return `console-${crypto.randomUUID()}`;
}

/** A page of a list as the API answers it: `next_page` is passed back as `page` for the next. */
export interface ListPage<T> {
  data: T[];
  next_page?: string | null;
}

/**
 * Every item of a list, page after page, for a picker that must offer them all (a list's default
 * page is 20 items): at most `max` items, so a huge list costs a bounded number of requests.
 */
export async function everyPage<T>(page: (cursor: string | undefined) => Promise<ListPage<T>>, max = 2_000): Promise<T[]> {
  const all: T[] = [];
  let cursor: string | undefined;
  do {
    const r = await page(cursor);
    all.push(...r.data);
    cursor = r.next_page ?? undefined;
  } while (cursor && all.length < max);
  return all;
}
