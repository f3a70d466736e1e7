import { describe, expect, it, vi } from 'vitest';
import { egressFetch } from './egress-fetch.js';

/** A name server that never answers: every lookup of a host name hangs. */
vi.mock('node:dns/promises', () => ({ lookup: () => new Promise<never>(() => undefined) }));

describe('an outbound request whose host name never resolves', () => {
  it('ends when its signal aborts, as the caller\'s timeout says', async () => {
    const send = egressFetch({ policy: { development: false, allowPrivate: false } });
    const started = Date.now();
    const outcome = await Promise.race([
      send('https://tools.example.com/a2a', { method: 'POST', body: '{}', signal: AbortSignal.timeout(200) }).then(() => 'answered', (err: unknown) => (err as Error).name),
      new Promise<string>((resolve) => setTimeout(() => resolve('hung'), 3000)),
    ]);
    expect(outcome).toBe('TimeoutError');
    expect(Date.now() - started).toBeLessThan(1500);
  });

  it('is not sent at all with a signal that already aborted', async () => {
    const send = egressFetch({ policy: { development: false, allowPrivate: false } });
    await expect(send('https://tools.example.com/a2a', { signal: AbortSignal.abort() })).rejects.toMatchObject({ name: 'AbortError' });
  });
});
