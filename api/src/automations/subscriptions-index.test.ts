import { randomBytes } from 'node:crypto';
import { describe, expect, it } from 'vitest';
import { useEmbeddedRedis } from '@agentplane/store/testing';
import { newId, nowIso, SecretBox } from '@agentplane/core';
import { DocumentStore, tags } from '@agentplane/store';
import { AutomationStore, automationKeys } from './store.js';
import { AUTOMATIONS, type AutomationDoc, type Trigger } from './model.js';

/**
 * The event tap reads a Workspace's subscription Automations from their own index, not every
 * Automation of the Workspace: a subscription is indexed with its document, leaves it with its
 * delete, and those made before the index existed are indexed once, by the first reader.
 */
const testRedis = useEmbeddedRedis('automation-subscriptions');
const store = () => new AutomationStore(testRedis(), new DocumentStore(testRedis()), new SecretBox(randomBytes(32)));

const SUB: Trigger = { type: 'subscription', event: 'session.turn_ended', filter: { stop_reasons: [], agent_ids: [] } };
const CRON: Trigger = { type: 'schedule', cron: '0 * * * *', timezone: 'UTC', on_missed: 'fire_once' };

function doc(ws: string, trigger: Trigger): AutomationDoc {
  const now = nowIso();
  return {
    id: newId('automation'), type: 'automation', workspace_id: ws, name: 'a', status: 'active', principal_id: newId('principal'),
    agent: { id: newId('agent'), version: null }, environment_id: newId('environment'), prompt: 'p', budget: null,
    max_concurrent_firings: 1, trigger, webhook: null, version: 1, created_at: now, updated_at: now,
  };
}

describe('subscription index', () => {
  it('lists a Workspace\'s subscriptions only, from their create to their delete', async () => {
    const s = store();
    const ws = newId('workspace');
    const sub = doc(ws, SUB);
    await s.create(sub, null);
    await s.create(doc(ws, CRON), null);
    expect(await s.subscriptionIds(ws)).toEqual([sub.id]);
    await s.remove(ws, sub.id);
    expect(await s.subscriptionIds(ws)).toEqual([]);
  });

  it('subscriptions made before the index existed are indexed once, by the first process that reads them', async () => {
    const ws = newId('workspace');
    // As an earlier version wrote them: listed among the Workspace's Automations only.
    const old = doc(ws, SUB);
    const docs = new DocumentStore(testRedis());
    await docs.create(tags.workspace(ws), old, [AUTOMATIONS]);
    await docs.create(tags.workspace(ws), doc(ws, CRON), [AUTOMATIONS]);
    const s = store();
    expect(await s.subscriptionIds(ws)).toEqual([old.id]);
    expect(await testRedis().exists(automationKeys.subscriptionsIndexed(ws))).toBe(1);
    // Made after: indexed with its document; another process reads both without indexing again.
    const later = doc(ws, SUB);
    await s.create(later, null);
    expect((await store().subscriptionIds(ws)).sort()).toEqual([old.id, later.id].sort());
  });
});
