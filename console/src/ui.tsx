/** Small shared pieces: data loading hook, error banner, status badge, time formatting. */
import type { ComponentChildren } from 'preact';
import { useCallback, useEffect, useRef, useState } from 'preact/hooks';
import { describeError } from './api';

export interface Async<T> {
  data: T | undefined;
  error: string | null;
  loading: boolean;
  reload(): void;
}

/** Run `load` when `deps` change (and on reload); the latest call wins. */
export function useAsync<T>(load: () => Promise<T>, deps: unknown[]): Async<T> {
  const [data, setData] = useState<T | undefined>(undefined);
  const [error, setError] = useState<string | null>(null);
  const [loading, setLoading] = useState(true);
  const [tick, setTick] = useState(0);
  const generation = useRef(0);
  useEffect(() => {
    const mine = ++generation.current;
    setLoading(true);
    load().then(
      (v) => {
        if (mine !== generation.current) return;
        setData(v);
        setError(null);
        setLoading(false);
      },
      (err: unknown) => {
        if (mine !== generation.current) return;
        setError(describeError(err));
        setLoading(false);
      },
    );
  }, [...deps, tick]);
  const reload = useCallback(() => setTick((t) => t + 1), []);
  return { data, error, loading, reload };
}

export function ErrorBanner({ error }: { error: string | null | undefined }) {
  if (!error) return null;
  return <p class="error" role="alert">{error}</p>;
}

export function Badge({ value }: { value: string | null | undefined }) {
  const v = value ?? 'unknown';
  return <span class={`badge badge-${v.replace(/[^a-z_]/gi, '')}`}>{v}</span>;
}

export function fmtTime(iso: string | null | undefined): string {
  if (!iso) return '—';
  const d = new Date(iso);
  return Number.isNaN(d.getTime()) ? iso : d.toLocaleString(undefined, { dateStyle: 'short', timeStyle: 'medium' });
}

export function fmtAgo(iso: string | null | undefined, now = Date.now()): string {
  if (!iso) return '—';
  const s = Math.round((now - Date.parse(iso)) / 1000);
  if (s < 0) return `in ${-s}s`;
  if (s < 60) return `${s}s ago`;
  if (s < 3600) return `${Math.floor(s / 60)}m ago`;
  return `${Math.floor(s / 3600)}h ago`;
}

export function fmtMs(ms: number): string {
  if (ms < 1000) return `${Math.round(ms)} ms`;
  if (ms < 60_000) return `${(ms / 1000).toFixed(ms < 10_000 ? 2 : 1)} s`;
  return `${Math.floor(ms / 60_000)}m ${Math.round((ms % 60_000) / 1000)}s`;
}

export function fmtUsd(amount: number | undefined): string {
  return amount === undefined ? '—' : `$${amount.toFixed(amount < 1 ? 4 : 2)}`;
}

export function Section({ title, actions, children, id }: { title: string; actions?: ComponentChildren; children: ComponentChildren; id?: string }) {
  const headingId = `h-${id ?? title.toLowerCase().replace(/[^a-z0-9]+/g, '-')}`;
  return (
    <section class="card" aria-labelledby={headingId}>
      <div class="card-head">
        <h2 id={headingId}>{title}</h2>
        {actions ? <div class="actions">{actions}</div> : null}
      </div>
      {children}
    </section>
  );
}

/** Re-render every `ms` (for "last seen 3s ago" columns). */
export function useTicker(ms: number): number {
  const [now, setNow] = useState(Date.now());
  useEffect(() => {
    const t = setInterval(() => setNow(Date.now()), ms);
    return () => clearInterval(t);
  }, [ms]);
  return now;
}

export function Json({ value }: { value: unknown }) {
  return <pre class="json" tabIndex={0}>{typeof value === 'string' ? value : JSON.stringify(value, null, 2)}</pre>;
}
