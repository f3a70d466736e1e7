import { createRequire } from 'node:module';

/**
 * ioredis pipelines without their per-instance `length` accessor.
 *
 * ioredis builds a `Pipeline` for every `multi()` and `pipeline()`, and, with auto-pipelining
 * (our default), for every batch of commands one tick sends. Its constructor defines `length`
 * on each instance with `Object.defineProperty` and a getter closing over the pipeline. In V8 an
 * accessor made per instance keeps what its closure reaches (the pipeline, its commands, their
 * arguments and replies) alive through young-generation collections until the next full one:
 * measured on bench:dispatch at 50 Runs/s, about half of everything the API and the scheduler
 * promoted to the old generation, and scavenges several times slower (docs/RUNS.md, "Garbage").
 *
 * `installLeanPipelines` swaps the module's constructor for one that sets the same fields as
 * ioredis's (its `Commander` base's and its own) on an object of the same prototype, and defines
 * `length` once, on that prototype. `instanceof Pipeline` still holds; `redis.pipeline()` and
 * `redis.multi()` look the constructor up on the module at each call, so they, BullMQ's clients
 * and auto-pipelining all get it. A unit test compares the fields with ioredis's own pipeline,
 * so an ioredis upgrade that changes its constructor fails the test instead of going unseen.
 */

/** On a client: how many times it defined a script or added a builtin (`countDefinitions`). */
const DEFINED: unique symbol = Symbol.for('agentplane.definedCommands') as never;

interface ScriptLike {
  sha: string;
}

/** The parts of an ioredis client (single or cluster) the constructor reads. */
interface PipelineHost {
  constructor: { name: string };
  isCluster?: boolean;
  options: unknown;
  scriptsSet: Record<string, ScriptLike>;
  addedBuiltinSet: Set<string>;
  [DEFINED]?: number;
  [method: string]: unknown;
}

type PipelineConstructor = new (redis: PipelineHost) => object;

interface PipelineModule {
  default: PipelineConstructor;
}

const require = createRequire(import.meta.url);
const LEAN = Symbol.for('agentplane.leanPipeline');

interface CommanderModule {
  default: { prototype: Record<string | symbol, unknown> };
}

/**
 * Every client counts its definitions (`defineCommand`, `addBuiltinCommand`, on ioredis's
 * `Commander`, which the single and cluster clients extend), so a pipeline's shared shape knows
 * when to rebuild without looking at every script. False when the module is not as expected.
 */
function countDefinitions(): boolean {
  let mod: CommanderModule;
  try {
    mod = require('ioredis/built/utils/Commander') as CommanderModule;
  } catch {
    return false;
  }
  const proto = mod.default?.prototype;
  if (!proto) return false;
  if (proto[DEFINED]) return true;
  for (const method of ['defineCommand', 'addBuiltinCommand']) {
    const original = proto[method];
    if (typeof original !== 'function') return false;
    proto[method] = function counted(this: Record<symbol, number>, ...args: unknown[]): unknown {
      const r: unknown = (original as (...a: unknown[]) => unknown).apply(this, args);
      this[DEFINED] = (this[DEFINED] ?? 0) + 1;
      return r;
    };
  }
  proto[DEFINED] = 0;
  return true;
}

let original: PipelineConstructor | undefined;

/** ioredis's own Pipeline constructor (for the parity test); undefined before installation. */
export function originalPipeline(): PipelineConstructor | undefined {
  return original;
}

/** Installs the lean constructor once per process; false when ioredis's module is not as expected. */
export function installLeanPipelines(): boolean {
  let mod: PipelineModule;
  try {
    mod = require('ioredis/built/Pipeline') as PipelineModule;
  } catch {
    return false;
  }
  const current = mod.default as PipelineConstructor & { [LEAN]?: PipelineConstructor };
  if (typeof current !== 'function') return false;
  if (current[LEAN]) {
    original = current[LEAN];
    return true;
  }
  const proto = current.prototype as object;
  if (Object.getOwnPropertyDescriptor(proto, 'length') === undefined) {
    Object.defineProperty(proto, 'length', {
      configurable: true,
      get(this: { _queue: unknown[] }): number {
        return this._queue.length;
      },
    });
  }

  if (!countDefinitions()) return false;

  /**
   * What every pipeline of one client shares: its scripts' and added builtins' methods, on a
   * prototype of its own (ioredis copies them onto each pipeline: with BullMQ's sixty-odd
   * scripts defined on a client, about 130 properties written per pipeline, each auto-pipelined
   * batch included), and the sha → script map exec reads. Rebuilt when the client defines more.
   */
  const shapes = new WeakMap<object, { proto: object; shaToScript: Record<string, ScriptLike>; version: number }>();
  const shapeOf = (redis: PipelineHost): { proto: object; shaToScript: Record<string, ScriptLike> } => {
    const version = (redis[DEFINED] as number | undefined) ?? 0;
    const known = shapes.get(redis);
    if (known && known.version === version) return known;
    const shared = Object.create(proto) as Record<string, unknown>;
    const shaToScript: Record<string, ScriptLike> = {};
    for (const name of Object.keys(redis.scriptsSet)) {
      const script = redis.scriptsSet[name] as ScriptLike;
      shaToScript[script.sha] = script;
      shared[name] = redis[name];
      shared[`${name}Buffer`] = redis[`${name}Buffer`];
    }
    for (const name of redis.addedBuiltinSet) {
      shared[name] = redis[name];
      shared[`${name}Buffer`] = redis[`${name}Buffer`];
    }
    const shape = { proto: shared, shaToScript, version };
    shapes.set(redis, shape);
    return shape;
  };

  function LeanPipeline(redis: PipelineHost): object {
    const shape = shapeOf(redis);
    const p = Object.create(shape.proto) as Record<string, unknown>;
    // Commander's constructor (its empty `options` is replaced by the client's below).
    p.scriptsSet = {};
    p.addedBuiltinSet = new Set<string>();
    // Pipeline's, but `length` (on the prototype).
    p.redis = redis;
    p.isPipeline = true;
    p.replyPending = 0;
    p._queue = [];
    p._result = [];
    p._transactions = 0;
    // Read by exec only: shared by the client's pipelines.
    p._shaToScript = shape.shaToScript;
    p.isCluster = redis.constructor.name === 'Cluster' || redis.isCluster;
    p.options = redis.options;
    p.promise = new Promise((resolve, reject) => {
      p.resolve = resolve;
      p.reject = reject;
    });
    return p;
  }
  LeanPipeline.prototype = proto;
  Object.defineProperty(LeanPipeline, LEAN, { value: current });
  original = current;
  mod.default = LeanPipeline as unknown as PipelineConstructor;
  return true;
}
