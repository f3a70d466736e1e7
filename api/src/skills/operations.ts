import { ApiError, Id, LogicalKey, Nullable, Obj, Page, PageQuery, Timestamp, Type } from '@agentplane/core';
import { SKILL_LIMITS, type SkillFile } from '@agentplane/domain';
import { READERS, WRITERS } from '../http/caller.js';
import { defineOperation, json, type Operation, type UploadBody } from '../http/operation.js';
import { workspaceRead, workspaceWrite } from '../http/workspace-operation.js';
import { requireWorkspace } from '../http/workspace-scope.js';
import { receiveSkillTar } from './tar.js';
import type { SkillDoc, SkillVersion } from '@agentplane/domain';
import { createHash } from 'node:crypto';

const readers = { kind: 'bearer', roles: READERS } as const;
const writers = { kind: 'bearer', roles: WRITERS } as const;
const Digest = () => Type.String({ pattern: '^sha256:[0-9a-f]{64}$' });

export const SkillVersionSchema = Obj({
  type: Type.Literal('skill_version'),
  skill_id: Id('skill'),
  name: LogicalKey(),
  description: Type.String(),
  version: Type.Integer({ minimum: 1 }),
  origin: Type.Union([Type.Literal('api'), Type.Literal('import'), Type.Literal('source')]),
  files: Type.Array(Obj({ path: Type.String(), size_bytes: Type.Integer({ minimum: 0 }), sha256: Digest(), executable: Type.Boolean() })),
  file_count: Type.Integer({ minimum: 1 }),
  total_bytes: Type.Integer({ minimum: 0 }),
  content_sha256: Digest(),
  created_at: Timestamp(),
});

export const SkillSchema = Obj({
  id: Id('skill'),
  type: Type.Literal('skill'),
  workspace_id: Id('workspace'),
  name: LogicalKey(),
  description: Type.String(),
  latest_version: Type.Integer({ minimum: 1 }),
  latest: Type.Optional(SkillVersionSchema),
  archived_at: Nullable(Timestamp()),
  version: Type.Integer({ minimum: 1 }),
  created_at: Timestamp(),
  updated_at: Timestamp(),
});

const SkillPath = Obj({ skill_id: Id('skill') });
const VersionPath = Obj({ skill_id: Id('skill'), version: Type.Integer({ minimum: 1 }) });

const SkillFileInput = Obj({
  path: Type.String({ minLength: 1, maxLength: SKILL_LIMITS.maxPathChars }),
  content: Type.Optional(Type.String()),
  content_base64: Type.Optional(Type.String()),
  executable: Type.Optional(Type.Boolean()),
});

const BASE64 = /^[A-Za-z0-9+/]*={0,2}$/;

/** JSON files → bytes: exactly one of `content` (UTF-8 text) and `content_base64`, each file at most 1 MiB decoded. */
function decodeFiles(files: ReadonlyArray<{ path: string; content?: string | undefined; content_base64?: string | undefined; executable?: boolean | undefined }>): SkillFile[] {
  return files.map((f, i) => {
    const field = `body.files[${i}]`;
    if ((f.content === undefined) === (f.content_base64 === undefined)) throw new ApiError('validation.malformed', `${field}: exactly one of content and content_base64`);
    let content: Buffer;
    if (f.content !== undefined) {
      if (f.content.length > SKILL_LIMITS.maxFileBytes) throw new ApiError('validation.malformed', `${field}: a skill file holds at most ${SKILL_LIMITS.maxFileBytes} bytes (1 MiB)`);
      content = Buffer.from(f.content, 'utf8');
    } else {
      const b64 = f.content_base64 ?? '';
      if (b64.length % 4 !== 0 || !BASE64.test(b64)) throw new ApiError('validation.malformed', `${field}.content_base64: not valid base64`);
      if ((b64.length / 4) * 3 - 2 > SKILL_LIMITS.maxFileBytes) throw new ApiError('validation.malformed', `${field}: a skill file holds at most ${SKILL_LIMITS.maxFileBytes} bytes (1 MiB)`);
      content = Buffer.from(b64, 'base64');
    }
    return { path: f.path, content, executable: f.executable ?? false };
  });
}

const view = (skill: SkillDoc, latest: SkillVersion) => ({ ...skill, latest });

const tarUpload: UploadBody = {
  contentType: 'application/x-tar',
  schema: Type.String({ contentEncoding: 'binary', description: `a tar archive of the skill directory, at most ${SKILL_LIMITS.maxArchiveBytes} bytes` }),
  receive: async (stream) => ({ files: await receiveSkillTar(stream) }),
  // A retry with the same key must carry the same directory.
  fingerprint: (b) => createHash('sha256').update(JSON.stringify((b.files as SkillFile[]).map((f) => [f.path, f.executable, createHash('sha256').update(f.content).digest('hex')]))).digest('hex'),
  discard: async () => undefined,
};

/**
 * Skills: versioned Agent Skill directories (`SKILL.md` with `name` and `description` front
 * matter, plus files). Every write is a new immutable version of the skill its `SKILL.md`
 * names. docs/SKILLS.md.
 */
export const skillOperations: Operation[] = [
  workspaceWrite('POST', {
    operationId: 'skills.createSkill', path: '/v1/skills', summary: 'Publish a skill directory (JSON files) as a new immutable version',
    audit: { target: 'response' }, auth: writers, idempotency: 'optional', mcp: 'never', successStatus: 201,
    body: Obj({ files: Type.Array(SkillFileInput, { minItems: 1, maxItems: SKILL_LIMITS.maxFiles }) }),
    response: SkillSchema,
  }, async (ws, { body, idempotencyKey, deps }) => {
    const { skill, version } = await deps.skills.publish(ws, decodeFiles(body.files), 'api', 'body.files', undefined, idempotencyKey);
    return view(skill, version);
  }),
  defineOperation({
    operationId: 'skills.importSkill', method: 'POST', path: '/v1/skills/import', summary: 'Publish a skill directory from a tar archive (application/x-tar) as a new immutable version',
    audit: { target: 'response' }, auth: writers, idempotency: 'optional', mcp: 'never', successStatus: 201, upload: tarUpload,
    response: SkillSchema,
    async handler({ caller, body, idempotencyKey, deps }) {
      const files = (body as unknown as { files: SkillFile[] }).files;
      const { skill, version } = await deps.skills.publish(requireWorkspace(caller), files, 'import', 'tar', undefined, idempotencyKey);
      return json(201, view(skill, version));
    },
  }),
  workspaceRead({
    operationId: 'skills.listSkills', path: '/v1/skills', summary: 'List the Skills of the Workspace',
    auth: readers, query: PageQuery({ include_archived: Type.Optional(Type.Boolean({ default: false })) }), response: Page(SkillSchema), mcp: 'full',
  }, async (ws, { query, deps }) => {
    const page = await deps.skills.list(ws, { limit: query.limit ?? 20, page: query.page, includeArchived: query.include_archived ?? false });
    return page;
  }),
  workspaceRead({
    operationId: 'skills.getSkill', path: '/v1/skills/{skill_id}', summary: 'Read a Skill and its latest version',
    auth: readers, params: SkillPath, response: SkillSchema, mcp: 'full',
  }, async (ws, { params, deps }) => deps.skills.view(await deps.skills.get(ws, params.skill_id))),
  workspaceRead({
    operationId: 'skills.getSkillVersion', path: '/v1/skills/{skill_id}/versions/{version}', summary: 'Read one immutable version\'s manifest',
    auth: readers, params: VersionPath, response: SkillVersionSchema, mcp: 'full',
  }, async (ws, { params, deps }) => {
    await deps.skills.get(ws, params.skill_id);
    return deps.skills.version(params.skill_id, params.version);
  }),
  workspaceRead({
    operationId: 'skills.getSkillVersionFiles', path: '/v1/skills/{skill_id}/versions/{version}/files', summary: 'Read one version\'s files (base64)',
    auth: readers, params: VersionPath, mcp: 'never',
    response: Obj({ files: Type.Array(Obj({ path: Type.String(), executable: Type.Boolean(), content_base64: Type.String() })) }),
  }, async (ws, { params, deps }) => {
    await deps.skills.get(ws, params.skill_id);
    const files = await deps.skills.files(params.skill_id, params.version);
    return { files: files.map((f) => ({ path: f.path, executable: f.executable, content_base64: f.content.toString('base64') })) };
  }),
  workspaceWrite('POST', {
    operationId: 'skills.archiveSkill', path: '/v1/skills/{skill_id}/archive', summary: 'Archive a Skill (no longer listed or selectable; a new version unarchives it)',
    audit: { target: 'skill_id' }, auth: writers, params: SkillPath, mcp: 'full', response: SkillSchema,
  }, async (ws, { params, deps }) => deps.skills.view(await deps.skills.archive(ws, params.skill_id))),
];
