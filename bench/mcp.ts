/**
 * tools/call of a read operation through POST /v1/mcp versus the same REST call,
 * 32 concurrent clients, in one run against one platform on loopback.
 * The REST call is the floor; the ratio is what the MCP edge costs on top.
 *
 *   npm run bench:mcp            (BENCH_SECONDS=<per phase>, BENCH_CLIENTS=<n>)
 */
import { startPlatform } from '../test/harness/platform.js';

const CLIENTS = Number(process.env.BENCH_CLIENTS ?? 32);
const PHASE_SECONDS = Number(process.env.BENCH_SECONDS ?? 4);
const ROUNDS = 2;

type Call = () => Promise<void>;

function percentile(sorted: number[], q: number): number {
  if (sorted.length === 0) return NaN;
  return sorted[Math.min(sorted.length - 1, Math.floor(q * sorted.length))] as number;
}

async function phase(call: Call, seconds: number, into: number[]): Promise<void> {
  const until = performance.now() + seconds * 1000;
  await Promise.all(
    Array.from({ length: CLIENTS }, async () => {
      while (performance.now() < until) {
        const t0 = performance.now();
        await call();
        into.push(performance.now() - t0);
      }
    }),
  );
}

async function main(): Promise<void> {
  const p = await startPlatform({ env: { LOG_LEVEL: 'warn' } });
  try {
    const ws = p.bootstrap.workspace_id;
    const auth = `Bearer ${p.bootstrap.root_key}`;
    const restUrl = `${p.baseUrl}/v1/organizations/workspaces/${ws}`;
    const mcpUrl = `${p.baseUrl}/v1/mcp`;
    const mcpBody = JSON.stringify({
      jsonrpc: '2.0', id: 1, method: 'tools/call',
      params: { name: 'organizations_getWorkspace', arguments: { path: { workspace_id: ws } } },
    });

    const rest: Call = async () => {
      const r = await fetch(restUrl, { headers: { authorization: auth, 'service-version': '2026-08-27' } });
      const body = (await r.json()) as { id?: string };
      if (r.status !== 200 || body.id !== ws) throw new Error(`REST ${r.status}`);
    };
    const mcp: Call = async () => {
      const r = await fetch(mcpUrl, {
        method: 'POST',
        headers: { authorization: auth, 'content-type': 'application/json', accept: 'application/json, text/event-stream', 'mcp-protocol-version': '2025-11-25' },
        body: mcpBody,
      });
      const body = (await r.json()) as { result?: { isError?: boolean } };
      if (r.status !== 200 || body.result?.isError !== false) throw new Error(`MCP ${r.status}`);
    };

    // Warm both paths (JIT, connection pool, Redis).
    await phase(rest, 1, []);
    await phase(mcp, 1, []);

    const restMs: number[] = [];
    const mcpMs: number[] = [];
    for (let i = 0; i < ROUNDS; i++) {
      await phase(rest, PHASE_SECONDS / ROUNDS, restMs);
      await phase(mcp, PHASE_SECONDS / ROUNDS, mcpMs);
    }
    restMs.sort((a, b) => a - b);
    mcpMs.sort((a, b) => a - b);
    const row = (name: string, xs: number[]) => ({
      path: name,
      requests: xs.length,
      'req/s': Math.round(xs.length / PHASE_SECONDS),
      'p50 ms': +percentile(xs, 0.5).toFixed(2),
      'p99 ms': +percentile(xs, 0.99).toFixed(2),
    });
    console.log(`\n${CLIENTS} concurrent clients, ${PHASE_SECONDS}s per path, GET workspace (organizations.getWorkspace)\n`);
    console.table([row('REST GET (floor)', restMs), row('MCP tools/call', mcpMs)]);
    const r50 = percentile(mcpMs, 0.5) / percentile(restMs, 0.5);
    const r99 = percentile(mcpMs, 0.99) / percentile(restMs, 0.99);
    console.log(`ratio MCP/REST: p50 ${r50.toFixed(2)}x, p99 ${r99.toFixed(2)}x`);
  } finally {
    await p.stop();
  }
}

await main();
