import type { Gateway } from '@agentplane/gateway';
import type { Payload } from '@agentplane/protocol';
import { tags, type DocumentStore, type StoredDoc } from '@agentplane/store';

type Release = Payload<'sandboxes.release'>['sessions'][number];

interface SessionHead extends StoredDoc {
  type: 'session' | 'session_tombstone';
  workspace_id: string;
  archived_at?: string | null;
}

/**
 * Which of a runner's sandboxes may go: those whose Session was archived or deleted (or is
 * unknown in the runner's Workspace). Answered from the Session documents, so a runner that
 * was offline when the Session ended learns it on its next report.
 */
export async function releasableSandboxes(docs: DocumentStore, workspaceId: string, sessionIds: readonly string[]): Promise<Release[]> {
  // A child thread's sandbox is named `<session>.<thread suffix>` (docs/COORDINATION.md): it goes with its Session.
  const owners = sessionIds.map((id) => id.split('.')[0] as string);
  const heads = await Promise.all(owners.map((id) => docs.get<SessionHead>(tags.session(id), id)));
  const out: Release[] = [];
  heads.forEach((doc, i) => {
    const session_id = sessionIds[i] as string;
    if (!doc || doc.workspace_id !== workspaceId || doc.type === 'session_tombstone') out.push({ session_id, reason: 'deleted' });
    else if (doc.archived_at) out.push({ session_id, reason: 'archived' });
  });
  return out;
}

/** The gateway's answer to `sandboxes.report`: `sandboxes.release` for the Sessions that ended. */
export function registerSandboxRelease(gw: Gateway, docs: DocumentStore): void {
  gw.on('sandboxes.report', async (conn, msg) => {
    const sessions = await releasableSandboxes(docs, conn.identity.workspaceId, msg.payload.session_ids);
    conn.send('sandboxes.release', { sessions }, msg.id);
  });
}
