import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createLogger } from '@agentplane/core';
import { ScriptedAdapter } from '@agentplane/models';
import type { ModelClient, ModelMessage } from '@agentplane/protocol';
import { probeInitialize, runAcp, type AcpEvent } from '../runner-daemon/src/acp/client.js';
import { AcpHarnesses, harnessArgv, installHarness, type InstalledHarness } from '../runner-daemon/src/acp/install.js';
import { ProcessDriver } from '../runner-daemon/src/sandbox/process-driver.js';
import type { GateQuery } from '../runner-daemon/src/harness/loop.js';
import { FIXTURE_COMMAND, packFixtureAgent } from './harness/acp-fixture.js';

/**
 * The ACP client against the fixture agent without a platform or Docker: the process driver, the
 * scripted model in process, a collecting sink, a recording policy gate. Fast coverage of the
 * install, the probe, the event mapping, the confinement of `fs/*` and the permission path.
 */
const log = createLogger({ name: 'acp-client-test', level: 'silent' });
const dir = mkdtempSync(join(tmpdir(), 'acp-client-'));
const driver = new ProcessDriver({ runnerId: 'r-acp', dataDir: join(dir, 'sandboxes') });
let harness: InstalledHarness;

const scripted = new ScriptedAdapter();
const model: ModelClient = { stream: (request, signal) => scripted.stream({ request, model: 'scripted-1', baseUrl: null, apiKey: null } as never, signal) };
const script = (rules: unknown[]): string => `\`\`\`scripted\n${JSON.stringify({ rules })}\n\`\`\``;
const user = (text: string): ModelMessage => ({ role: 'user', content: [{ type: 'text', text }] });

beforeAll(async () => {
  harness = await installHarness(await packFixtureAgent(), join(dir, 'acp'), log);
}, 60_000);
afterAll(() => rmSync(dir, { recursive: true, force: true }));

async function turn(
  sessionId: string, rules: unknown[], history: ModelMessage[],
  gate?: (q: GateQuery) => Promise<{ decision: 'allow' | 'deny' | 'require_approval'; rule_id: string | null; message: string }>,
  deliver?: (e: AcpEvent) => Promise<void>,
) {
  const sandbox = await driver.ensure({ id: sessionId }, {});
  const events: AcpEvent[] = [];
  const checks: GateQuery[] = [];
  const outcome = await runAcp({
    driver, sandbox, model, log, signal: new AbortController().signal,
    sink: { emit: async (e) => (deliver ? deliver(e) : void events.push(e)) },
    argv: harnessArgv(harness, FIXTURE_COMMAND, 'process') ?? [],
    routingKey: 'default', instructions: script(rules), history, sessions: new Map(),
    gate: async (q) => {
      checks.push(q);
      return gate ? gate(q) : { decision: 'allow', rule_id: null, message: 'ok' };
    },
  });
  return { outcome, events, checks, sandbox };
}

describe('the ACP client (process driver)', () => {
  it('installs the packed agent, records a digest, and the probe gets an initialize answer', async () => {
    expect(harness).toMatchObject({ name: 'agentplane-acp-fixture', version: '1.0.0', bins: { [FIXTURE_COMMAND]: 'agent.mjs' } });
    expect(harness.digest).toMatch(/^sha256:[0-9a-f]{64}$/);
    const acp = new AcpHarnesses([harness], undefined, log);
    expect(acp.find('agentplane-acp-fixture')).toBeUndefined();
    await acp.probe(driver, 'unused', (d, s, argv) => probeInitialize(d, s, argv));
    expect(acp.find('agentplane-acp-fixture@1.0.0')?.id).toBe(harness.id);
    expect(acp.find('agentplane-acp-fixture@2.0.0')).toBeUndefined();
    expect(acp.report()).toEqual([{ package: 'agentplane-acp-fixture', version: '1.0.0', harness_release_digest: harness.digest }]);
  });

  it('maps a turn to events and checks each permission request with the mapped tool and input', async () => {
    const { outcome, events, checks, sandbox } = await turn('sess_map', [
      { when: { user_contains: 'go' }, then: [{ think: 'plan' }, { reply: 'On it.' }, { tool: 'run', input: { command: 'echo hi' } }] },
      { when: { after_tool: 'run' }, then: [{ tool: 'write_file', input: { path: 'sub/f.txt', content: 'data' } }] },
      { when: { after_tool: 'write_file' }, then: [{ reply: 'Done.' }] },
    ], [user('go')]);
    expect(outcome.stop_reason).toEqual({ type: 'end_turn' });
    expect(outcome.usage.output_tokens).toBeGreaterThan(0);
    expect(events.map((e) => e.type)).toEqual([
      'agent.plan', 'agent.thinking', 'agent.message', 'agent.tool_use', 'agent.tool_result', 'agent.tool_use', 'agent.tool_result', 'agent.message', 'agent.plan',
    ]);
    expect(checks.map((c) => [c.tool.name, (c.input as { command?: string }).command])).toEqual([['bash', 'echo hi'], ['edit', undefined]]);
    expect(events[4]).toMatchObject({ payload: { content: 'hi\n', is_error: false } });
    expect(readFileSync(join(sandbox.workspace, 'sub/f.txt'), 'utf8')).toBe('data');
  });

  it('an event that could not be delivered fails the turn instead of ending it as if it had been', async () => {
    const sent: string[] = [];
    const delivery = new Error('the control plane did not take the events');
    const deliver = async (e: AcpEvent) => {
      // The agent's message is refused (as a delivery that gave up would be); nothing after it is sent.
      if (e.type === 'agent.message') throw delivery;
      sent.push(e.type);
    };
    await expect(turn('sess_undelivered', [
      { when: { user_contains: 'go' }, then: [{ reply: 'On it.' }, { tool: 'run', input: { command: 'echo hi' } }] },
      { when: { after_tool: 'run' }, then: [{ reply: 'Done.' }] },
    ], [user('go')], undefined, deliver)).rejects.toBe(delivery);
    expect(sent).not.toContain('agent.tool_use');
  });

  it('refuses fs access outside the workspace', async () => {
    const { events } = await turn('sess_escape', [
      { when: { user_contains: 'peek' }, then: [{ tool: 'read_file', input: { path: '../../../../etc/hostname' } }] },
      { when: { after_tool: 'read_file' }, then: [{ reply: 'Read: {{tool_result}}' }] },
    ], [user('peek')]);
    const result = events.find((e) => e.type === 'agent.tool_result');
    expect(result).toMatchObject({ payload: { is_error: true } });
    expect(JSON.stringify(result)).toContain('outside the workspace');
  });

  it('a denied permission is recorded as the refusal and the command does not run', async () => {
    const { events, sandbox } = await turn('sess_deny', [
      { when: { user_contains: 'touch' }, then: [{ tool: 'run', input: { command: 'touch marker' } }] },
      { when: { on: 'tool_result' }, then: [{ reply: 'Said: {{tool_result}}' }] },
    ], [user('touch it')], async () => ({ decision: 'deny', rule_id: 'apol_x', message: 'no' }));
    expect(events.filter((e) => e.type === 'agent.tool_result')).toEqual([
      { type: 'agent.tool_result', payload: expect.objectContaining({ is_error: true, denied: true, policy_rule_id: 'apol_x', content: "Not run: refused by the workspace's ActionPolicy apol_x (no)." }) },
    ]);
    expect(() => readFileSync(join(sandbox.workspace, 'marker'))).toThrow();
  });
});
