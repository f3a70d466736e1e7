/**
 * The URL of an API path under a control-plane base URL that may carry a base path:
 * `apiUrl('https://host/agentplane', '/v1/sessions')` is `https://host/agentplane/v1/sessions`
 * (`new URL('/v1/sessions', base)` would drop `/agentplane`). A query or fragment on the base is
 * dropped; one on `path` is kept.
 */
export function apiUrl(base: string | URL, path: string): URL {
  const b = new URL(base);
  const prefix = b.pathname.replace(/\/+$/, '');
  const rel = path.startsWith('/') ? path : `/${path}`;
  const u = new URL(`${prefix}${rel}`, b.origin);
  u.username = b.username;
  u.password = b.password;
  return u;
}
