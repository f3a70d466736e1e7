/**
 * The colocated harness program (bundled into one file, `dist/colocated/harness.mjs`, and run by
 * the runner inside the sandbox as `node /tmp/agentplane-harness.mjs`): the same `HarnessLoop`
 * and built-in tools as the split topology, with tool commands as local child processes and model
 * steps, MCP calls and events over the stdio relay (`./protocol.ts`). Reads `start`, runs the Run,
 * writes `done` (or `error`) and exits. Nothing but relay lines may reach stdout.
 */
import type { AgentTool } from '../events.js';
import { HarnessLoop } from '../loop.js';
import { LocalCommands } from './local-commands.js';
import { LineSplitter, type RelayTool } from './protocol.js';
import { RelayClient } from './relay-client.js';
import { BrowserSession } from '../tools/browser-session.js';
import { launchLocal } from './browser-local.js';

function writeLine(line: string): void {
  process.stdout.write(line);
}

async function finish(code: number): Promise<never> {
  // Let the last lines leave before exiting.
  await new Promise<void>((resolve) => (process.stdout.writableNeedDrain ? process.stdout.once('drain', resolve) : resolve()));
  process.exit(code);
}

async function main(): Promise<void> {
  const relay = new RelayClient(writeLine);
  let relayDone = false;
  const splitter = new LineSplitter(
    (line) => relay.receive(line),
    (err) => {
      process.stderr.write(`agentplane harness: ${err.message}\n`);
      void finish(2);
    },
  );
  process.stdin.on('data', (chunk: Buffer) => {
    try {
      splitter.push(chunk);
    } catch (err) {
      process.stderr.write(`agentplane harness: ${(err as Error).message}\n`);
      void finish(2);
    }
  });
  // The runner closed stdin: it has gone (or given up on this Run). Stop.
  process.stdin.on('end', () => void finish(relayDone ? 0 : 3));

  const run = await relay.started;
  const tools = run.agent.tools.map((t: RelayTool): AgentTool =>
    t.type === 'external'
      ? { type: 'external', spec: t.spec, ...(t.permission ? { permission: t.permission } : {}), call: (input, signal, toolUseId) => relay.callTool(toolUseId, t.spec.name, input, signal) }
      : t,
  );
  // The Environment's browser: Chromium in this sandbox, driven from here; screenshots go to the runner.
  const browser = run.browser ? new BrowserSession(() => launchLocal()) : undefined;
  const loop = new HarnessLoop({
    model: relay.model,
    driver: new LocalCommands(),
    sandbox: { sessionId: 'colocated', driver: 'docker', ref: 'local', workspace: process.cwd(), createdAt: Date.now(), reused: true },
    sink: relay.sink,
    // Every tool use is checked against the workspace's ActionPolicies through the runner first.
    gate: (q) => relay.checkTool(q),
    ...(browser ? { browser, storeFile: (f) => relay.storeFile(f) } : {}),
  });
  try {
    const outcome = await loop.run({
      agent: { ...run.agent, tools },
      history: run.history,
      ...(run.responses ? { responses: run.responses } : {}),
      signal: relay.signal,
      ...(run.max_duration_seconds ? { max_duration_seconds: run.max_duration_seconds } : {}),
    });
    // The browser ends with the Run (before `done`: the runner then lets the harness go).
    await browser?.close();
    relay.send({ type: 'done', outcome: { stop_reason: outcome.stop_reason } });
  } catch (err) {
    await browser?.close();
    relay.send({ type: 'error', message: err instanceof Error ? err.message : String(err) });
  }
  relayDone = true;
  await finish(0);
}

main().catch((err: unknown) => {
  process.stderr.write(`agentplane harness: ${err instanceof Error ? (err.stack ?? err.message) : String(err)}\n`);
  process.exit(1);
});
