// bench:mcp — tools/call of a read operation through POST /v1/mcp vs the same REST call
// (GET /v1/organizations/workspaces/{id}), 32 concurrent connections each, against one platform
// in one run, loopback only. The REST call is the floor: the ratio is what the MCP edge adds
// (JSON-RPC parsing, the tool projection, framing the REST body as a tool result).
import autocannon from 'autocannon';
import { startPlatform } from '../test/harness/platform.js';
import { printTable, type HttpLoad } from './lib/report.js';
import { benchHelp } from './lib/help.js';

benchHelp(import.meta.url);

const CONNECTIONS = Number(process.env.BENCH_CONNECTIONS ?? 32);
const DURATION = Number(process.env.BENCH_SECONDS ?? 8);

type Load = HttpLoad;

type Target = Pick<autocannon.Options, 'url' | 'method' | 'headers' | 'body'>;

async function load(target: Target, seconds: number): Promise<Load> {
  const r = await autocannon({ ...target, connections: CONNECTIONS, duration: seconds });
  return { p50: r.latency.p50, p99: r.latency.p99, rps: r.requests.average, errors: r.errors, non2xx: r.non2xx };
}

async function main(): Promise<void> {
  process.stdout.write(`bench:mcp  ${CONNECTIONS} connections, ${DURATION}s per target\n`);
  const p = await startPlatform({ env: { LOG_LEVEL: 'warn' } });
  try {
    const ws = p.bootstrap.workspace_id;
    const auth = `Bearer ${p.bootstrap.root_key}`;
    const rest: Target = {
      url: `${p.baseUrl}/v1/organizations/workspaces/${ws}`,
      method: 'GET',
      headers: { authorization: auth, 'service-version': '2026-08-27' },
    };
    const mcp: Target = {
      url: `${p.baseUrl}/v1/mcp`,
      method: 'POST',
      headers: { authorization: auth, 'content-type': 'application/json', accept: 'application/json, text/event-stream', 'mcp-protocol-version': '2025-11-25' },
      body: JSON.stringify({
        jsonrpc: '2.0', id: 1, method: 'tools/call',
        params: { name: 'organizations_getWorkspace', arguments: { path: { workspace_id: ws } } },
      }),
    };
    // The same call on the stateless 2026-07-28 shape (per-request _meta envelope, Mcp-* headers).
    const modern: Target = {
      url: mcp.url,
      method: 'POST',
      headers: { ...(mcp.headers as Record<string, string>), 'mcp-protocol-version': '2026-07-28', 'mcp-method': 'tools/call', 'mcp-name': 'organizations_getWorkspace' },
      body: JSON.stringify({
        jsonrpc: '2.0', id: 1, method: 'tools/call',
        params: {
          name: 'organizations_getWorkspace', arguments: { path: { workspace_id: ws } },
          _meta: { 'io.modelcontextprotocol/protocolVersion': '2026-07-28', 'io.modelcontextprotocol/clientCapabilities': {} },
        },
      }),
    };
    // Sanity: each MCP call really is a successful tool call, not a fast error.
    for (const t of [mcp, modern]) {
      const probe = await fetch(t.url, { method: 'POST', headers: t.headers as Record<string, string>, body: t.body as string });
      const probed = (await probe.json()) as { result?: { isError?: boolean } };
      if (probe.status !== 200 || probed.result?.isError !== false) throw new Error(`the MCP probe failed: ${probe.status} ${JSON.stringify(probed)}`);
    }

    process.stdout.write('warming both paths …\n');
    await load(rest, 2);
    await load(mcp, 2);
    await load(modern, 1);
    // Alternate halves so that drift on a shared machine hits both targets alike.
    const half = Math.max(1, Math.round(DURATION / 2));
    process.stdout.write('loading REST (floor) and MCP tools/call, alternating …\n');
    const r1 = await load(rest, half);
    const m1 = await load(mcp, half);
    const r2 = await load(rest, half);
    const m2 = await load(mcp, half);
    process.stdout.write('loading MCP tools/call on the 2026-07-28 shape …\n');
    const n1 = await load(modern, half);
    const avg = (a: Load, b: Load): Load => ({
      p50: (a.p50 + b.p50) / 2, p99: (a.p99 + b.p99) / 2, rps: (a.rps + b.rps) / 2, errors: a.errors + b.errors, non2xx: a.non2xx + b.non2xx,
    });
    const restLoad = avg(r1, r2);
    const mcpLoad = avg(m1, m2);

    printTable('tools/call through POST /v1/mcp vs the same REST GET', [
      { metric: 'latency p50', ours: mcpLoad.p50, floor: restLoad.p50, unit: 'ms' },
      { metric: 'latency p99', ours: mcpLoad.p99, floor: restLoad.p99, unit: 'ms' },
      { metric: 'throughput', ours: mcpLoad.rps, floor: restLoad.rps, unit: 'req/s', higherIsBetter: true },
    ]);
    printTable('tools/call on the 2026-07-28 shape vs the same REST GET', [
      { metric: 'latency p50', ours: n1.p50, floor: restLoad.p50, unit: 'ms' },
      { metric: 'latency p99', ours: n1.p99, floor: restLoad.p99, unit: 'ms' },
      { metric: 'throughput', ours: n1.rps, floor: restLoad.rps, unit: 'req/s', higherIsBetter: true },
    ]);
    process.stdout.write(`errors: mcp ${mcpLoad.errors + mcpLoad.non2xx + n1.errors + n1.non2xx}, rest ${restLoad.errors + restLoad.non2xx}\n`);
  } finally {
    await p.stop();
  }
}

await main();
