/**
 * Group commit: calls made close together that write to the same place are sent as one command.
 * `add(key, item)` joins the item to the open batch of `key` and resolves with that item's own
 * result once the batch is sent and answered. Batches are sent when `schedule` calls back
 * (`process.nextTick`: the end of the tick; `setImmediate`: the end of this turn of the event
 * loop, once every connection that was ready has been read), or at once when a batch would grow
 * past `maxWeight`. Batches of one key are sent in the order they were opened, items in the
 * order added.
 */
export class Joiner<T, R> {
  private readonly open = new Map<string, { items: T[]; weight: number; settle: { resolve: (r: R) => void; reject: (err: unknown) => void }[] }>();

  constructor(
    private readonly options: {
      schedule: (flush: () => void) => void;
      /** Sends one batch (its items share the key); resolves with one result per item, in order. */
      send: (items: T[]) => Promise<R[]>;
      /** The most weight (items, unless `weigh` says otherwise) one batch holds. */
      maxWeight: number;
      weigh?: (item: T) => number;
    },
  ) {}

  add(key: string, item: T): Promise<R> {
    const w = this.options.weigh?.(item) ?? 1;
    let batch = this.open.get(key);
    if (batch && batch.weight + w > this.options.maxWeight) {
      this.open.delete(key);
      this.send(batch);
      batch = undefined;
    }
    if (!batch) {
      if (this.open.size === 0) this.options.schedule(() => this.flush());
      batch = { items: [], weight: 0, settle: [] };
      this.open.set(key, batch);
    }
    batch.items.push(item);
    batch.weight += w;
    const own = batch;
    return new Promise<R>((resolve, reject) => own.settle.push({ resolve, reject }));
  }

  private flush(): void {
    const batches = [...this.open.values()];
    this.open.clear();
    for (const b of batches) this.send(b);
  }

  private send(b: { items: T[]; settle: { resolve: (r: R) => void; reject: (err: unknown) => void }[] }): void {
    const fail = (err: unknown) => b.settle.forEach((s) => s.reject(err));
    let sent: Promise<R[]>;
    try {
      sent = this.options.send(b.items);
    } catch (err) {
      fail(err);
      return;
    }
    // A batch answered with the wrong number of results fails whole: no caller is left waiting.
    sent.then((results) => {
      if (results.length !== b.settle.length) return fail(new Error(`a joined batch of ${b.settle.length} was answered with ${results.length} results`));
      b.settle.forEach((s, i) => s.resolve(results[i] as R));
    }, fail);
  }
}
