import { describe, expect, it } from 'vitest';
import { RelayClient } from './relay-client.js';

describe('RelayClient.callTool', () => {
  it('answers a call whose signal is already aborted as interrupted, without sending it', async () => {
    const lines: string[] = [];
    const client = new RelayClient((line) => lines.push(line));
    const controller = new AbortController();
    controller.abort();
    const r = await client.callTool('toolu_1', 'search', { q: 'x' }, controller.signal);
    expect(r).toEqual({ content: 'Interrupted before the tool ran.', is_error: true });
    expect(lines).toEqual([]);
  }, 5_000);

  it('sends a call and answers it interrupted when the signal aborts while it runs', async () => {
    const lines: string[] = [];
    const client = new RelayClient((line) => lines.push(line));
    const controller = new AbortController();
    const pending = client.callTool('toolu_2', 'search', { q: 'y' }, controller.signal);
    expect(lines).toHaveLength(1);
    expect(JSON.parse(lines[0] as string)).toMatchObject({ type: 'tool.call', tool_use_id: 'toolu_2', name: 'search' });
    controller.abort();
    expect(await pending).toEqual({ content: 'Interrupted before the tool finished.', is_error: true });
  }, 5_000);
});
