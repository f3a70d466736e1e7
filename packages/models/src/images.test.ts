import { describe, expect, it } from 'vitest';
import type { ModelRequest } from '@agentplane/protocol';
import { toMessagesBody } from './anthropic.js';
import { toChatCompletionsBody } from './openai.js';
import { estimateRequestTokens, IMAGE_TOKENS } from './scripted.js';

describe('screenshots reach the model as images', () => {
  const request: ModelRequest = {
    routing_key: 'default', tools: [],
    messages: [
      { role: 'user', content: [{ type: 'text', text: 'look' }] },
      { role: 'assistant', content: [{ type: 'tool_use', id: 'toolu_1', name: 'browser_screenshot', input: {} }] },
      { role: 'user', content: [{ type: 'tool_result', tool_use_id: 'toolu_1', content: 'stored as File file_1', images: [{ type: 'image', media_type: 'image/png', data: 'iVBORw0KGgo=' }] }] },
    ],
  };

  it('Anthropic: an image block inside the tool result', () => {
    const body = toMessagesBody(request, 'm') as { messages: { content: unknown[] }[] };
    expect(body.messages[2]?.content[0]).toEqual({
      type: 'tool_result', tool_use_id: 'toolu_1',
      content: [{ type: 'text', text: 'stored as File file_1' }, { type: 'image', source: { type: 'base64', media_type: 'image/png', data: 'iVBORw0KGgo=' } }],
    });
  });

  it('OpenAI-compatible: the tool message, then a user message with the image', () => {
    const body = toChatCompletionsBody(request, 'm') as { messages: { role: string; content: unknown }[] };
    expect(body.messages.at(-2)).toEqual({ role: 'tool', tool_call_id: 'toolu_1', content: 'stored as File file_1' });
    expect(body.messages.at(-1)).toEqual({ role: 'user', content: [{ type: 'text', text: 'Images returned by the tool calls above:' }, { type: 'image_url', image_url: { url: 'data:image/png;base64,iVBORw0KGgo=' } }] });
  });
});


describe('the input estimate of a request with images', () => {
  const shot = (data: string) => ({ type: 'image' as const, media_type: 'image/png' as const, data });
  const withImages = (images: ReturnType<typeof shot>[], input: unknown = {}): ModelRequest => ({
    routing_key: 'default', tools: [],
    messages: [
      { role: 'assistant', content: [{ type: 'tool_use', id: 'toolu_1', name: 'browser_screenshot', input }] },
      { role: 'user', content: [{ type: 'tool_result', tool_use_id: 'toolu_1', content: 'stored', images }] },
    ],
  });

  it('counts each image at IMAGE_TOKENS, whatever its encoded size', () => {
    const none = estimateRequestTokens(withImages([]));
    expect(estimateRequestTokens(withImages([shot('A'.repeat(800_000))]))).toBe(none + IMAGE_TOKENS);
    expect(estimateRequestTokens(withImages([shot('A'.repeat(8)), shot('A'.repeat(400_000))]))).toBe(none + 2 * IMAGE_TOKENS);
  });

  it("counts a tool input's own `images` field as text", () => {
    const input = { images: ['a.png', 'b.png'] };
    const plain = estimateRequestTokens(withImages([]));
    const named = estimateRequestTokens(withImages([], input));
    expect(named).toBeGreaterThan(plain);
    expect(named).toBeLessThan(plain + IMAGE_TOKENS);
  });
});
