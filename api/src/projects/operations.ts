import { Id, Obj, Page, PageQuery, Type } from '@agentplane/core';
import { READERS, WRITERS } from '../http/caller.js';
import { createdId, earlierAttempt } from '../http/keyed-create.js';
import type { Operation } from '../http/operation.js';
import { pageOf, workspaceRead, workspaceWrite } from '../http/workspace-operation.js';
import { PROJECT_ENVELOPE_BYTES, PROJECT_LIMITS, ProjectPath, ProjectSchema, RevisionSchema, TreeFile } from './model.js';

const ProjectIdPath = Obj({ project_id: Id('project') });
const readers = { kind: 'bearer', roles: READERS } as const;
const writers = { kind: 'bearer', roles: WRITERS } as const;
const Files = Type.Array(TreeFile, { maxItems: PROJECT_LIMITS.maxFiles });

/**
 * Uploaded Projects: JSON trees with base64 file contents, kept as immutable revisions and
 * mounted into a Session's sandbox as an `uploaded_project` resource (docs/MEMORY.md, "Projects").
 * The tree routes take bodies up to the computed envelope (413 past it, while streaming); the
 * revision limits (1,024 files, 10 MiB per file, 20 MiB per revision, 64 files per push) are 400.
 *
 * A keyed revision (`createRevision`, `pushProject`) is appended once per request (its token
 * derived from the request's fingerprint, which holds the project's id, so a createRevision and a
 * push, or two requests, never share one): the retry of one whose first attempt died after
 * appending (crash point `project-revision-appended`), its key's pending record lapsed, is answered
 * that revision (201, the same `revision_number`) instead of appending the tree again or being
 * refused as stale (409 `validation.conflict`).
 */
export const projectOperations: Operation[] = [
  workspaceWrite('POST', {
    operationId: 'projects.createProject', path: '/v1/projects', summary: 'Upload a Project tree (revision 1)',
    audit: { target: 'response' }, auth: writers, idempotency: 'optional', mcp: 'never', successStatus: 201, bodyLimitBytes: PROJECT_ENVELOPE_BYTES,
    body: Obj({ name: Type.String({ minLength: 1, maxLength: 200 }), files: Files }),
    response: ProjectSchema,
  }, async (ws, { body, deps, keyed }) => {
    // Made once per keyed request: the retry of a create that died after writing its head (crash
    // point `project-created`) answers that Project; one that died before it (after revision 1,
    // `project-revision-committed`) finishes it under the same id, keeping that revision. Only the
    // Project as the first attempt made it is answered: a later revision changed it, even one whose
    // head did not move on (its process died in between), as a new version of the head does.
    const id = createdId('project', keyed);
    const found = keyed ? await deps.projects.findCreated(ws, id) : null;
    // Refused (409 `idempotency.conflict`) when changed or older than keys are kept.
    if (keyed && found) earlierAttempt(found.project, keyed, (p) => p.version === 1 && found.revisions <= 1);
    const { project, revision } = found ?? await deps.projects.create(ws, body.name, body.files, id);
    return { ...project, latest_revision_number: revision.revision_number, latest_revision: revision };
  }),
  workspaceRead({
    operationId: 'projects.listProjects', path: '/v1/projects', summary: 'List the Projects of the Workspace',
    auth: readers, query: PageQuery({}), response: Page(ProjectSchema), mcp: 'full',
  }, async (ws, { query, deps }) => {
    const page = await deps.projects.list(ws, pageOf(query));
    return { data: await Promise.all(page.data.map((p) => deps.projects.view(p))), next_page: page.next_page };
  }),
  workspaceRead({
    operationId: 'projects.getProject', path: '/v1/projects/{project_id}', summary: 'Read a Project and its latest revision number',
    auth: readers, params: ProjectIdPath, response: ProjectSchema, mcp: 'full',
  }, async (ws, { params, deps }) => deps.projects.view(await deps.projects.get(ws, params.project_id))),
  workspaceWrite('DELETE', {
    operationId: 'projects.deleteProject', path: '/v1/projects/{project_id}', summary: 'Delete a Project, its revisions and contents',
    audit: { target: 'project_id' }, auth: writers, params: ProjectIdPath, mcp: 'full',
    response: Obj({ id: Id('project'), type: Type.Literal('project_deleted') }),
  }, async (ws, { params, deps }) => {
    await deps.projects.remove(ws, params.project_id);
    return { id: params.project_id, type: 'project_deleted' };
  }),
  workspaceWrite('POST', {
    operationId: 'projects.createRevision', path: '/v1/projects/{project_id}/revisions', summary: 'Upload a complete new tree as the next revision',
    audit: { target: 'project_id' }, auth: writers, params: ProjectIdPath, idempotency: 'optional', mcp: 'never', successStatus: 201,
    bodyLimitBytes: PROJECT_ENVELOPE_BYTES,
    body: Obj({ files: Files, expected_revision_number: Type.Optional(Type.Integer({ minimum: 1 })) }),
    response: RevisionSchema,
  }, (ws, { params, body, deps, keyed }) => deps.projects.addRevision(ws, params.project_id, body.files, body.expected_revision_number, keyed?.write('project'))),
  workspaceRead({
    operationId: 'projects.getRevision', path: '/v1/projects/{project_id}/revisions/{revision_number}', summary: 'Read a revision\'s manifest (paths, sizes, digests)',
    auth: readers, params: Obj({ project_id: Id('project'), revision_number: Type.Integer({ minimum: 1 }) }), response: RevisionSchema, mcp: 'full',
  }, async (ws, { params, deps }) => {
    await deps.projects.get(ws, params.project_id);
    return deps.projects.revision(params.project_id, params.revision_number);
  }),
  workspaceWrite('POST', {
    operationId: 'projects.pushProject', path: '/v1/projects/{project_id}/push',
    summary: 'Push up to 64 changed or deleted files on top of the latest revision (a git push manifest)',
    audit: { target: 'project_id' }, auth: writers, params: ProjectIdPath, idempotency: 'optional', mcp: 'never', successStatus: 201,
    bodyLimitBytes: PROJECT_ENVELOPE_BYTES,
    body: Obj({
      base_revision_number: Type.Integer({ minimum: 1 }),
      changes: Type.Array(Obj({
        path: ProjectPath(), content_base64: Type.Optional(Type.String()), executable: Type.Optional(Type.Boolean()), delete: Type.Optional(Type.Literal(true)),
      }), { minItems: 1 }),
    }),
    response: RevisionSchema,
  }, (ws, { params, body, deps, keyed }) => deps.projects.push(ws, params.project_id, body.base_revision_number, body.changes, keyed?.write('project'))),
];
