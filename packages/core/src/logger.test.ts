import { describe, expect, it } from 'vitest';
import { spawnSync } from 'node:child_process';
import { createLogger, redactSecrets } from './logger.js';

function capture() {
  const lines: string[] = [];
  const log = createLogger({ name: 'test', level: 'debug', destination: { write: (s: string) => void lines.push(s) } });
  const last = (): Record<string, unknown> => JSON.parse(lines.at(-1) ?? 'null') as Record<string, unknown>;
  return { log, lines, last };
}

const SECRET = 'ap_key_0123456789abcdef-not-for-logs';

describe('createLogger redaction', () => {
  it('redacts a secret field three and more levels deep, in objects and arrays', () => {
    const { log, lines, last } = capture();
    log.info({ request: { upstream: { auth: { type: 'bearer', token: SECRET } } } }, 'nested');
    log.info({ a: { b: { c: { d: { e: { password: SECRET } } } } } }, 'deeper');
    log.info({ servers: [{ name: 'one', auth: { api_key: SECRET } }, [{ bearer: SECRET }]] }, 'arrays');
    log.info({ spec: { runtime_files: { bearer: SECRET }, connection: { sealed_secret: SECRET, upstream_token: SECRET } } }, 'names');
    log.info({ req: { headers: { Authorization: `Bearer ${SECRET}`, 'X-Api-Key': SECRET, 'content-type': 'application/json' } } }, 'headers');
    expect(lines).toHaveLength(5);
    for (const line of lines) expect(line).not.toContain(SECRET);
    expect(last()).toMatchObject({ req: { headers: { Authorization: '[redacted]', 'X-Api-Key': '[redacted]', 'content-type': 'application/json' } } });
    expect(JSON.parse(lines[0] ?? '')).toMatchObject({ msg: 'nested', request: { upstream: { auth: { type: 'bearer', token: '[redacted]' } } } });
  });

  it('logs `code` as is: exit codes and err.code', () => {
    const { log, last } = capture();
    log.warn({ child: 'scheduler', code: 1, signal: null }, 'platform process exited');
    expect(last()).toMatchObject({ code: 1, signal: null });
    log.error({ code: 'E_BAD', detail: { code: 42 } }, 'codes at depth');
    expect(last()).toMatchObject({ code: 'E_BAD', detail: { code: 42 } });

    const refused = Object.assign(new Error('connect ECONNREFUSED 127.0.0.1:6379'), { code: 'ECONNREFUSED', errno: -111 });
    log.warn({ err: refused }, 'redis unreachable');
    expect(last()).toMatchObject({ err: { type: 'Error', code: 'ECONNREFUSED', errno: -111, message: 'connect ECONNREFUSED 127.0.0.1:6379' } });
    expect((last().err as { stack: string }).stack).toContain('ECONNREFUSED');
    log.error(refused);
    expect(last()).toMatchObject({ msg: 'connect ECONNREFUSED 127.0.0.1:6379', err: { type: 'Error', code: 'ECONNREFUSED' } });
    log.warn({ attempt: { n: 3, error: refused } }, 'nested error');
    expect(last()).toMatchObject({ attempt: { n: 3, error: { type: 'Error', code: 'ECONNREFUSED' } } });
  });

  it("redacts secrets an Error carries in its own fields", () => {
    const { log, lines, last } = capture();
    class HttpError extends Error {
      constructor(message: string, readonly config: unknown) {
        super(message);
      }
    }
    log.error({ err: new HttpError('upstream said 401', { url: 'https://mcp.example/mcp', headers: { authorization: `Bearer ${SECRET}` } }) }, 'call failed');
    expect(lines.at(-1)).not.toContain(SECRET);
    expect(last()).toMatchObject({ err: { type: 'HttpError', message: 'upstream said 401', config: { url: 'https://mcp.example/mcp', headers: { authorization: '[redacted]' } } } });
  });

  it('redacts child bindings, and those of grandchildren', () => {
    const { log, lines, last } = capture();
    const child = log.child({ runner: 'runner_1', upstream: { auth: { token: SECRET } } });
    child.info('from the child');
    child.child({ session: { credential: SECRET, id: 'sess_1' } }).info({ x: { y: { secret: SECRET } } }, 'from the grandchild');
    for (const line of lines) expect(line).not.toContain(SECRET);
    expect(last()).toMatchObject({ runner: 'runner_1', session: { credential: '[redacted]', id: 'sess_1' }, x: { y: { secret: '[redacted]' } } });
  });

  it('keeps what only looks like a secret: hints, flags, counts, key names', () => {
    const { log, last } = capture();
    log.info({ auth: { secret_hint: '…6789', has_secret: true }, usage: { input_tokens: 12, max_tokens: 100 }, credential_key: 'default' }, 'x');
    expect(last()).toMatchObject({ auth: { secret_hint: '…6789', has_secret: true }, usage: { input_tokens: 12, max_tokens: 100 }, credential_key: 'default' });
  });

  it('cuts cycles without logging what they hold', () => {
    const { log, lines, last } = capture();
    const node: Record<string, unknown> = { name: 'n', token: SECRET };
    node.self = node;
    node.list = [node];
    log.info({ node }, 'cyclic');
    expect(lines.at(-1)).not.toContain(SECRET);
    expect(last()).toMatchObject({ node: { name: 'n', token: '[redacted]', self: '[Circular]', list: ['[Circular]'] } });
  });
});

describe('redactSecrets', () => {
  it('never mutates its input and shares what holds no secret', () => {
    const clean = { a: { b: [1, 2, { c: 'd' }] }, when: new Date(0) };
    expect(redactSecrets(clean)).toBe(clean);
    const input = { keep: clean, deep: { token: SECRET } };
    const out = redactSecrets(input);
    expect(out).toEqual({ keep: clean, deep: { token: '[redacted]' } });
    expect(out.keep).toBe(clean);
    expect(input.deep.token).toBe(SECRET);
  });
});

describe('createLogger with sync', () => {
  /** A process that logs one line and at once kills itself: what reached its stdout. */
  const loggedThenKilled = (sync: boolean): string => {
    const core = new URL('../dist/index.js', import.meta.url).href;
    const script = `const { createLogger } = await import(${JSON.stringify(core)}); createLogger({ name: 't', sync: ${sync} }).info('written before the kill'); process.kill(process.pid, 'SIGKILL');`;
    return spawnSync(process.execPath, ['--input-type=module', '-e', script], { encoding: 'utf8' }).stdout;
  };

  it('writes a line to stdout before the call returns: a process killed right after has it out', () => {
    for (let i = 0; i < 5; i++) expect(loggedThenKilled(true)).toContain('written before the kill');
  });
});
