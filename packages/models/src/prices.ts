import type { TokenUsage } from '@agentplane/protocol';
import shipped from './prices.json' with { type: 'json' };

/** USD per million tokens. */
export interface ModelPrice {
  input: number;
  cached_input?: number;
  cache_write_input?: number;
  output: number;
}

/** provider → model name (or name prefix) → price. */
export type PriceTable = Record<string, Record<string, ModelPrice>>;

function isPrice(v: unknown): v is ModelPrice {
  if (!v || typeof v !== 'object') return false;
  const p = v as Record<string, unknown>;
  const num = (x: unknown) => typeof x === 'number' && Number.isFinite(x) && x >= 0;
  return num(p.input) && num(p.output) && (p.cached_input === undefined || num(p.cached_input)) && (p.cache_write_input === undefined || num(p.cache_write_input));
}

/** Validate a table read from JSON (keys starting with `$` are comments). Throws naming the first bad entry. */
export function parsePriceTable(value: unknown): PriceTable {
  if (!value || typeof value !== 'object' || Array.isArray(value)) throw new Error('a price table is an object of providers');
  const out: PriceTable = {};
  for (const [provider, models] of Object.entries(value)) {
    if (provider.startsWith('$')) continue;
    if (!models || typeof models !== 'object') throw new Error(`price table: ${provider} must be an object of models`);
    out[provider] = {};
    for (const [model, price] of Object.entries(models as Record<string, unknown>)) {
      if (!isPrice(price)) throw new Error(`price table: ${provider}/${model} needs non-negative input and output`);
      (out[provider] as Record<string, ModelPrice>)[model] = price;
    }
  }
  return out;
}

export const SHIPPED_PRICES: PriceTable = parsePriceTable(shipped);

/** The shipped table with `override` laid over it (per model). */
export function mergePriceTables(base: PriceTable, override: PriceTable): PriceTable {
  const out: PriceTable = {};
  for (const [p, models] of Object.entries(base)) out[p] = { ...models };
  for (const [p, models] of Object.entries(override)) out[p] = { ...(out[p] ?? {}), ...models };
  return out;
}

/** Exact name, else the longest listed prefix; null when the model is not priced. */
export function findPrice(table: PriceTable, provider: string, model: string): ModelPrice | null {
  const models = table[provider];
  if (!models) return null;
  const exact = models[model];
  if (exact) return exact;
  let best: string | null = null;
  for (const name of Object.keys(models)) if (model.startsWith(name) && (best === null || name.length > best.length)) best = name;
  return best === null ? null : (models[best] as ModelPrice);
}

/**
 * List cost in nano-USD (integer, so counters add exactly). Cached and cache-write tokens are
 * subsets of `input_tokens`; reasoning tokens are a subset of `output_tokens`.
 */
export function listCostNanoUsd(price: ModelPrice, usage: TokenUsage): number {
  const cached = Math.min(usage.cached_input_tokens, usage.input_tokens);
  const written = Math.min(usage.cache_write_input_tokens, usage.input_tokens - cached);
  const fresh = usage.input_tokens - cached - written;
  // price per million tokens = nano-USD per 1000 tokens... 1 USD/MTok = 1000 nano-USD per token.
  const perToken = (usd: number) => usd * 1000;
  return Math.round(
    fresh * perToken(price.input) +
      cached * perToken(price.cached_input ?? price.input) +
      written * perToken(price.cache_write_input ?? price.input) +
      usage.output_tokens * perToken(price.output),
  );
}

export const nanoToUsd = (nano: number): number => nano / 1e9;
export const usdToNano = (usd: number): number => Math.round(usd * 1e9);
