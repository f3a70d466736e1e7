import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { ROOT_DIR } from './harness/platform.js';
import { promtool, promtoolPresent, promtoolRequired } from './harness/promtool.js';

/**
 * The checked-in Prometheus configuration, alert rules and Grafana dashboard: valid for
 * promtool, the alerts behave as their unit tests say, and every metric they use is documented
 * in docs/OPERATIONS.md.
 */
const DOCKER = join(ROOT_DIR, 'docker');
const dirs: string[] = [];
afterAll(() => {
  for (const d of dirs) rmSync(d, { recursive: true, force: true });
});

interface Panel { type: string; title: string; targets?: { expr: string }[] }
const dashboard = JSON.parse(readFileSync(join(DOCKER, 'grafana/dashboards/agentplane.json'), 'utf8')) as { uid: string; panels: Panel[] };
const alerts = readFileSync(join(DOCKER, 'prometheus/alerts.yml'), 'utf8');
const operations = readFileSync(join(ROOT_DIR, 'docs/OPERATIONS.md'), 'utf8');
const exprs = dashboard.panels.flatMap((p) => (p.targets ?? []).map((t) => t.expr));

/** Metric families named in PromQL text (histogram series names folded to their family). */
const families = (text: string): string[] =>
  [...new Set([...text.matchAll(/\b((?:agentplane|nodejs|process)_[a-z0-9_]+)/g)].map((m) => (m[1] as string).replace(/_(bucket|count|sum)$/, '')))];

describe('promtool checks', () => {
  it.runIf(promtoolRequired)('promtool is installed (CI)', () => {
    expect(promtoolPresent).toBe(true);
  });

  it.runIf(promtoolPresent)('the scrape configuration passes promtool check config', () => {
    const r = promtool(['check', 'config', join(DOCKER, 'prometheus/prometheus.yml')]);
    expect(r.output).toContain('SUCCESS');
    expect(r.status).toBe(0);
  });

  it.runIf(promtoolPresent)('the alert rules pass promtool check rules and their unit tests', () => {
    const check = promtool(['check', 'rules', join(DOCKER, 'prometheus/alerts.yml')]);
    expect(check.output).toMatch(/SUCCESS: \d+ rules found/);
    expect(check.status).toBe(0);
    const unit = promtool(['test', 'rules', join(DOCKER, 'prometheus/alerts.test.yml')]);
    expect(unit.output).toContain('SUCCESS');
    expect(unit.status).toBe(0);
  });

  it.runIf(promtoolPresent)('every dashboard query is valid PromQL', () => {
    expect(exprs.length).toBeGreaterThan(20);
    const dir = mkdtempSync(join(tmpdir(), 'agentplane-dashboard-'));
    dirs.push(dir);
    const rules = {
      groups: [{ name: 'dashboard', rules: exprs.map((expr, i) => ({ record: `dashboard:query_${i}`, expr: expr.replaceAll('$__rate_interval', '5m') })) }],
    };
    writeFileSync(join(dir, 'rules.yml'), JSON.stringify(rules));
    const r = promtool(['check', 'rules', join(dir, 'rules.yml')]);
    expect(r.output).toContain(`SUCCESS: ${exprs.length} rules found`);
    expect(r.status).toBe(0);
  });

  it.runIf(promtoolPresent)('a broken rule file fails the check (the check can fail)', () => {
    const dir = mkdtempSync(join(tmpdir(), 'agentplane-rules-'));
    dirs.push(dir);
    writeFileSync(join(dir, 'bad.yml'), JSON.stringify({ groups: [{ name: 'x', rules: [{ alert: 'Bad', expr: 'sum by (pool (x)' }] }] }));
    expect(promtool(['check', 'rules', join(dir, 'bad.yml')]).status).not.toBe(0);
  });
});

describe('documentation', () => {
  it('every metric the alerts and the dashboard use is documented in docs/OPERATIONS.md', () => {
    const used = families(`${alerts}\n${exprs.join('\n')}`);
    expect(used.length).toBeGreaterThan(15);
    expect(used.filter((m) => !operations.includes(`\`${m}\``))).toEqual([]);
  });

  it('every alert is documented in docs/OPERATIONS.md', () => {
    const names = [...alerts.matchAll(/- alert: (\w+)/g)].map((m) => m[1] as string);
    expect(names.length).toBeGreaterThanOrEqual(10);
    expect(names.filter((n) => !operations.includes(n))).toEqual([]);
  });
});
