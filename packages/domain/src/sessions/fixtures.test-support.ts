import { newId, nowIso } from '@agentplane/core';
import type { SessionDoc } from './model.js';
import { newThreadDoc, type SessionStore } from './store.js';

/** For unit tests: a stored Session (with an inline agent) whose primary thread is idle. */
export async function idleSession(store: SessionStore): Promise<{ session: SessionDoc; threadId: string }> {
  const now = nowIso();
  const agent = { id: newId('agent'), type: 'agent' as const, name: 'a', version: 1, model: 'default', system: null, tools: [], mcp_servers: [] };
  const session: SessionDoc = {
    id: newId('session'), type: 'session', workspace_id: newId('workspace'), agent, environment_id: newId('environment'), environment_version: 1,
    title: null, budget: null, metadata: {}, resources: [], vault_ids: [], outcome_evaluations: [], archived_at: null, _primary_thread_id: '',
    version: 1, created_at: now, updated_at: now,
  };
  const thread = newThreadDoc(session, agent, null);
  session._primary_thread_id = thread.id;
  await store.create(session, thread);
  return { session, threadId: thread.id };
}
