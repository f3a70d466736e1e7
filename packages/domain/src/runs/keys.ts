import { keys, tags } from '@agentplane/store';

/** Run id → Session id, per workspace: `GET /v1/runs/{id}` finds the Session slot with it. */
export const runSessionsKey = (workspaceId: string): string => keys.scoped(tags.workspace(workspaceId), 'run_sessions');
