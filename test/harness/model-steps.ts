import type { HttpClient } from '@agentplane/client';
import type { ModelStreamEvent } from '@agentplane/protocol';

/** `POST /v1/organizations/workspaces/{ws}/model-steps` as an SSE client sends it: the status, headers and the whole body. */
export async function postModelStep(
  baseUrl: string, client: HttpClient, ws: string, body: unknown, signal?: AbortSignal,
): Promise<{ status: number; headers: Headers; text: string }> {
  const res = await fetch(`${baseUrl}/v1/organizations/workspaces/${ws}/model-steps`, {
    method: 'POST', headers: client.headers({ accept: 'text/event-stream' }, true), body: JSON.stringify(body), signal: signal ?? null,
  });
  return { status: res.status, headers: res.headers, text: await res.text() };
}

/** The events of a model step's SSE body, in order. */
export function stepEvents(text: string): ModelStreamEvent[] {
  return text.split('\n\n').filter((f) => f.includes('data: ')).map((f) => JSON.parse(f.slice(f.indexOf('data: ') + 6)) as ModelStreamEvent);
}
