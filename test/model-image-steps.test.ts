import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { HttpClient } from '@agentplane/client';
import { IMAGE_TOKENS } from '@agentplane/models';
import { startPlatform, type Platform } from './harness/platform.js';
import { postModelStep, stepEvents } from './harness/model-steps.js';

/**
 * An image a tool returned (a browser screenshot) costs the model a bounded number of tokens,
 * not its base64 length / 4: a step carrying screenshots fits a candidate's context window it
 * fits, and its budget reservation is not inflated by the image's bytes.
 */
let p: Platform;
let ws: string;
let c: HttpClient;

beforeAll(async () => {
  p = await startPlatform();
  const w = await p.root.request('POST', `/v1/organizations/${p.bootstrap.organization_id}/workspaces`, { body: { name: 'image-steps' } });
  ws = (w.body as { id: string }).id;
  c = p.root.with({ workspaceId: ws });
  const r = await c.request('POST', `/v1/organizations/workspaces/${ws}/model-routing-profiles`, {
    body: { key: 'vision', candidates: [{ credential_key: 'default', provider_model: 'scripted-1', constraints: { context_window_tokens: 128_000 } }] },
  });
  expect(r.status).toBe(201);
}, 120_000);
afterAll(async () => {
  await p?.stop();
});

describe('images in a model step', () => {
  it('two screenshots of 600 KB (base64) fit a 128k-token context window; the input is estimated per image, not per byte', async () => {
    const screenshot = { type: 'image', media_type: 'image/png', data: 'A'.repeat(600_000) };
    const messages = [
      { role: 'user', content: [{ type: 'text', text: 'look at the page twice' }] },
      { role: 'assistant', content: [{ type: 'tool_use', id: 'toolu_1', name: 'browser_screenshot', input: {} }, { type: 'tool_use', id: 'toolu_2', name: 'browser_screenshot', input: {} }] },
      { role: 'user', content: [
        { type: 'tool_result', tool_use_id: 'toolu_1', content: 'stored as File file_1', images: [screenshot] },
        { type: 'tool_result', tool_use_id: 'toolu_2', content: 'stored as File file_2', images: [screenshot] },
      ] },
    ];
    const r = await postModelStep(p.baseUrl, c, ws, { routing_key: 'vision', messages });
    expect(r.status, r.text).toBe(200);
    const events = stepEvents(r.text);
    const end = events.at(-1);
    expect(end?.type).toBe('end');
    const input = end?.type === 'end' ? end.usage.input_tokens : -1;
    expect(input).toBeGreaterThan(2 * IMAGE_TOKENS);
    expect(input).toBeLessThan(2 * IMAGE_TOKENS + 1000);
  }, 30_000);

  it('an image whose data is not base64 is refused 400 validation.malformed, before any provider call', async () => {
    for (const data of ['@@@not base64', 'QUJD', 'QUI', '']) {
      const messages = [{ role: 'user', content: [{ type: 'tool_result', tool_use_id: 'toolu_1', content: 'x', images: [{ type: 'image', media_type: 'image/png', data }] }] }];
      const r = await c.request('POST', `/v1/organizations/workspaces/${ws}/model-steps`, { body: { routing_key: 'vision', messages } });
      if (data === 'QUJD') {
        expect(r.status, data).toBe(200);
      } else {
        expect(r.status, data).toBe(400);
        expect(r.body).toMatchObject({ error: { type: 'validation.malformed' } });
      }
    }
  }, 30_000);
});
