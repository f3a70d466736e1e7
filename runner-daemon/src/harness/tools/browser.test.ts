import { describe, expect, it } from 'vitest';
import { RunAudit } from '../colocated/audit.js';
import { encodeLine, RelayError } from '../colocated/protocol.js';
import { parseHarnessLine } from '../colocated/validate.js';
import { allowedUrl, browserNavigateTool, browserSnapshotTool } from './browser.js';
import { runTool } from './builtin.js';
import { pngSize } from './browser-session.js';
import { MAX_REQUEST_BYTES_WITH_IMAGES, withinFrame } from '../loop.js';
import type { ToolContext } from './types.js';

const sandbox = { sessionId: 's', driver: 'docker' as const, ref: 'c', workspace: '/workspace', createdAt: 0, reused: false };
const ctx: ToolContext = { driver: { exec: () => Promise.reject(new Error('no commands here')) }, sandbox };

describe('browser tools: what they accept', () => {
  it('opens only pages inside the sandbox: the workspace and its loopback servers', () => {
    expect(allowedUrl('file:///workspace/site/index.html', '/workspace')).toBe('file:///workspace/site/index.html');
    expect(allowedUrl('/workspace/a.html', '/workspace')).toBe('file:///workspace/a.html');
    expect(allowedUrl('http://localhost:3000/x', '/workspace')).toBe('http://localhost:3000/x');
    expect(allowedUrl('http://127.0.0.1:8080/', '/workspace')).toBe('http://127.0.0.1:8080/');
    expect(allowedUrl('about:blank', '/workspace')).toBe('about:blank');
    for (const bad of ['https://example.com/', 'http://10.0.0.1/', 'file:///etc/passwd', 'file:///workspace/../etc/passwd', 'file:///workspaces/x', 'chrome://crash', 'javascript:alert(1)', 'not a url']) {
      expect(() => allowedUrl(bad, '/workspace'), bad).toThrow();
    }
  });

  it('without a browser in the Environment, or with a URL outside the sandbox, the model gets an error result', async () => {
    const none = await runTool(browserSnapshotTool, ctx, {});
    expect(none).toMatchObject({ is_error: true });
    expect(none.content).toContain('no browser');
    const outside = await runTool(browserNavigateTool, ctx, { url: 'https://example.com' });
    expect(outside.is_error).toBe(true);
    expect(outside.content).toContain('no network');
  });

  it('reads a PNG size from its header', () => {
    const head = Buffer.alloc(24);
    head.writeUInt32BE(0x89504e47, 0);
    head.write('IHDR', 12, 'ascii');
    head.writeUInt32BE(1280, 16);
    head.writeUInt32BE(720, 20);
    expect(pngSize(head)).toEqual({ width: 1280, height: 720 });
    expect(pngSize(Buffer.from('not a png at all, certainly not'))).toBeUndefined();
  });
});

describe('colocated screenshots: file.store under the run audit', () => {
  const store = (toolUseId: string) => encodeLine({ type: 'file.store', id: 'f1', tool_use_id: toolUseId, filename: 'screenshot-1.png', content_type: 'image/png', data: 'iVBORw0KGgo=' });

  it('parses file.store and rejects a wrong type, name or encoding', () => {
    expect(parseHarnessLine(store('toolu_1'))).toMatchObject({ type: 'file.store', tool_use_id: 'toolu_1', filename: 'screenshot-1.png' });
    const bad = (patch: Record<string, unknown>): void => {
      const line = JSON.stringify({ ...JSON.parse(store('toolu_1')) as object, ...patch });
      expect(() => parseHarnessLine(line)).toThrow(RelayError);
    };
    bad({ content_type: 'text/html' });
    bad({ filename: '../../etc/passwd' });
    bad({ data: 'not base64!' });
    bad({ extra: 1 });
  });

  it('stores only for a browser_screenshot use the model made, once; the result may name only that File', () => {
    const audit = new RunAudit([{ type: 'builtin', name: 'browser_screenshot' }, { type: 'builtin', name: 'bash' }], []);
    audit.modelEvent({ type: 'tool_use', id: 'toolu_1', name: 'browser_screenshot', input: {} });
    audit.modelEvent({ type: 'tool_use', id: 'toolu_2', name: 'bash', input: {} });
    expect(() => audit.fileStore('toolu_2')).toThrow(/not a browser_screenshot use/);
    expect(() => audit.fileStore('toolu_9')).toThrow(/not a browser_screenshot use/);
    audit.fileStore('toolu_1');
    expect(() => audit.fileStore('toolu_1')).toThrow(/twice/);
    audit.fileStored('toolu_1', 'file_abc');
    audit.event({ type: 'agent.tool_use', payload: { id: 'toolu_1', name: 'browser_screenshot', input: {}, blocking: false } });
    expect(() => audit.event({ type: 'agent.tool_result', payload: { tool_use_id: 'toolu_1', content: 'x', is_error: false, file_id: 'file_other' } })).toThrow(/did not store/);
    audit.event({ type: 'agent.tool_result', payload: { tool_use_id: 'toolu_1', content: 'x', is_error: false, file_id: 'file_abc' } });
  });
});

describe('model requests stay within one runner frame', () => {
  it('keeps images while the request fits, leaves them out (and says so) when it would not', () => {
    const shot = (data: string) => ({
      routing_key: 'default', tools: [],
      messages: [
        { role: 'user' as const, content: [{ type: 'text' as const, text: 'look' }] },
        { role: 'assistant' as const, content: [{ type: 'tool_use' as const, id: 'toolu_1', name: 'browser_screenshot', input: {} }] },
        { role: 'user' as const, content: [{ type: 'tool_result' as const, tool_use_id: 'toolu_1', content: 'stored as File file_1', images: [{ type: 'image' as const, media_type: 'image/png' as const, data }] }] },
      ],
    });
    const small = shot('iVBORw0KGgo=');
    expect(withinFrame(small)).toBe(small);
    const large = withinFrame(shot('A'.repeat(MAX_REQUEST_BYTES_WITH_IMAGES)));
    const result = large.messages[2]?.content[0];
    expect(result).toMatchObject({ type: 'tool_result', tool_use_id: 'toolu_1' });
    expect(result && 'images' in result).toBe(false);
    expect(result?.type === 'tool_result' ? result.content : '').toContain('The image is not shown');
  });
});
