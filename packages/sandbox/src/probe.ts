/**
 * Whether a runner credential is still accepted: how the reaper tells a runner that is gone for
 * good (revoked) from one whose control plane is merely down, and what `doctor` reports.
 */
import { WebSocket } from 'ws';
import { CLOSE, runnerConnectUrl } from '@agentplane/protocol';

export interface CredentialProbe {
  /** `accepted`: the gateway took it; `rejected`: revoked or unknown (401); `unreachable`: no verdict (403 included). */
  verdict: 'accepted' | 'rejected' | 'unreachable';
  /** HTTP status of a refused upgrade. */
  status?: number;
  detail: string;
  url: string;
}

/**
 * Whether the control plane still accepts a runner credential: a WebSocket upgrade and nothing
 * more (no hello), so a daemon connected with the same credential is not disturbed.
 */
export function probeCredential(baseUrl: string, secret: string, timeoutMs = 5000): Promise<CredentialProbe> {
  let url: URL;
  try {
    url = runnerConnectUrl(baseUrl);
  } catch (err) {
    return Promise.resolve({ verdict: 'unreachable', detail: `bad control-plane URL: ${err instanceof Error ? err.message : String(err)}`, url: baseUrl });
  }
  const where = url.toString();
  return new Promise<CredentialProbe>((resolve) => {
    const ws = new WebSocket(url, { headers: { authorization: `Bearer ${secret}` }, handshakeTimeout: timeoutMs });
    let done = false;
    const finish = (p: CredentialProbe): void => {
      if (done) return;
      done = true;
      resolve(p);
    };
    ws.on('unexpected-response', (_req, res) => {
      const s = res.statusCode ?? 0;
      // 401: revoked or unknown. 403 (owner or Workspace disabled) may be undone: not a rejection.
      finish({ verdict: s === 401 ? 'rejected' : 'unreachable', status: s, detail: `gateway answered HTTP ${s}`, url: where });
      ws.terminate();
    });
    ws.on('open', () => {
      finish({ verdict: 'accepted', detail: `WebSocket upgrade to ${url.pathname} succeeded`, url: where });
      ws.close(CLOSE.NORMAL, 'probe');
    });
    ws.on('error', (err) => finish({ verdict: 'unreachable', detail: err.message, url: where }));
  });
}
