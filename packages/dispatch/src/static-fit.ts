import { matchCapabilities, type RunnerCapabilities, type RunRequirements } from '@agentplane/lease';

/**
 * Whether a runner could ever serve a Run (its capabilities against the Run's requirements, how
 * busy it is aside), remembered per capabilities object. A placement asks it of every ready runner
 * of the pool for every Run, while the pool's view (and so each runner's capabilities object)
 * changes only when the directory reads the presences again, every 100 ms or so: between two
 * reads, the Runs of one Environment version meet the same answers. A capabilities object is
 * never changed once read (a new presence is a new object), so an answer kept for it stays true,
 * and goes with it.
 */
export class StaticFit {
  private readonly answers = new WeakMap<RunnerCapabilities, Map<string, boolean>>();

  /** The key of a Run's requirements (one per Run, then one lookup per runner). */
  static key(req: RunRequirements): string {
    return JSON.stringify(req);
  }

  fits(caps: RunnerCapabilities, req: RunRequirements, key: string): boolean {
    let known = this.answers.get(caps);
    if (!known) this.answers.set(caps, (known = new Map()));
    let ok = known.get(key);
    if (ok === undefined) {
      ok = matchCapabilities(req, caps).ok;
      known.set(key, ok);
    }
    return ok;
  }
}
