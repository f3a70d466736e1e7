import { keys, tags, type DocumentStore, type Redis, type StoredDoc } from '@agentplane/store';

/**
 * How a deployment's connection binding revision shapes the MCP tools a Run sees on the bound
 * Connection (docs/DEPLOYMENTS.md, "Connection bindings"): which upstream tools are offered
 * (`tool_selection`), under which name (`tool_aliases`: upstream name → the name the model
 * sees), and whether arguments outside the tool's input schema are refused (`argument_policy`).
 * It travels in the Run's runtime grant (`ConnectionGrant.shaping`) and the runtime MCP
 * endpoint applies it.
 */
export interface ToolShaping {
  agent_deployment_connection_binding_id: string;
  binding_revision_number: number;
  tool_selection: string[];
  tool_aliases: Record<string, string>;
  argument_policy: 'default' | 'strict';
}

/** The revision key of a deployment or binding head (the layout of the deployments store). */
export function headRevisionKey(workspaceId: string, headId: string, n: number): string {
  return keys.scoped(tags.workspace(workspaceId), `rev:${headId}:${n}`);
}

/**
 * The shaping of each bound Connection for a Session's pinned `connection_binding_selections`,
 * by Connection id. Binding revisions and a binding's Connection never change, so reading them
 * when a Run is offered gives what the Session was pinned to. A selection whose binding or
 * revision is gone shapes nothing (the Connection is then offered as the agent names it).
 */
export async function bindingShapings(
  redis: Redis,
  docs: DocumentStore,
  workspaceId: string,
  selections: readonly { agent_deployment_connection_binding_id: string; binding_revision_number: number }[],
): Promise<Map<string, ToolShaping>> {
  const out = new Map<string, ToolShaping>();
  for (const sel of selections) {
    const id = sel.agent_deployment_connection_binding_id;
    const head = await docs.get<StoredDoc & { workspace_id: string; integration_connection_id: string }>(tags.workspace(workspaceId), id);
    const raw = await redis.get(headRevisionKey(workspaceId, id, sel.binding_revision_number));
    if (!head || head.workspace_id !== workspaceId || raw === null) continue;
    const rev = JSON.parse(raw) as { tool_selection: string[]; tool_aliases: Record<string, string>; argument_policy: 'default' | 'strict' };
    out.set(head.integration_connection_id, {
      agent_deployment_connection_binding_id: id, binding_revision_number: sel.binding_revision_number,
      tool_selection: rev.tool_selection, tool_aliases: rev.tool_aliases, argument_policy: rev.argument_policy,
    });
  }
  return out;
}

/** The name the model sees for an upstream tool, or null when the binding does not select it. */
export function exposedName(shaping: ToolShaping, upstream: string): string | null {
  if (!shaping.tool_selection.includes(upstream)) return null;
  return aliasOf(shaping.tool_aliases, upstream);
}

/**
 * The name a selected tool is offered under: its alias, else its own. Only the aliases' own
 * entries count: a tool named like an Object.prototype member (`toString`) has no alias unless
 * one is given.
 */
function aliasOf(toolAliases: Readonly<Record<string, string>>, upstream: string): string {
  return Object.hasOwn(toolAliases, upstream) ? (toolAliases[upstream] as string) : upstream;
}

/** The upstream tool a name the model used stands for, or null when no selected tool is exposed under it. */
export function upstreamName(shaping: ToolShaping, exposed: string): string | null {
  for (const upstream of shaping.tool_selection) {
    if (aliasOf(shaping.tool_aliases, upstream) === exposed) return upstream;
  }
  return null;
}

/**
 * Argument names a `strict` binding refuses: every top-level argument must be a key of the
 * tool's input schema `properties` (a schema without `properties` admits no argument). Types,
 * `required` and nested objects are left to the upstream server. Sorted; empty when admitted.
 */
export function argumentsOutsideSchema(inputSchema: Record<string, unknown> | undefined, args: Record<string, unknown>): string[] {
  const props = inputSchema?.properties;
  const known = props !== null && typeof props === 'object' && !Array.isArray(props) ? new Set(Object.keys(props)) : new Set<string>();
  return Object.keys(args).filter((k) => !known.has(k)).sort();
}

/**
 * Two selected tools may not be exposed under one name (an alias equal to another selected
 * tool's exposed name, or two equal aliases): returns the clashing name, or null.
 */
export function exposedNameClash(toolSelection: readonly string[], toolAliases: Record<string, string>): string | null {
  const seen = new Set<string>();
  for (const upstream of toolSelection) {
    const name = aliasOf(toolAliases, upstream);
    if (seen.has(name)) return name;
    seen.add(name);
  }
  return null;
}
