import { describe, expect, it } from 'vitest';
import { ZERO_USAGE } from '@agentplane/protocol';
import { consistencyViolation, publicProposal, type SkillProposalDoc } from './model.js';

const base: SkillProposalDoc = {
  id: 'skp_1', type: 'skill_proposal', workspace_id: 'w', status: 'authoring', source_session_ids: ['s'], agent: 'a', model_routing_profile_key: 'default',
  instructions: null, verifications: [], usage: { ...ZERO_USAGE }, _skill_name: null, _environment_id: 'e', version: 1, created_at: '', updated_at: '',
};
const drafted = { ...base, status: 'drafted' as const, skill: { name: 'n', description: 'd', kind: 'instructional' as const, entry: 'SKILL.md', content_sha256: 'sha256:x' }, verification_material: { task: 't', rubric: 'r' } };
const attempt = { session: 's2', started_at: '', launched_at: '', source_version: 2, principal: 'p', result: null };
const result = { verdict: 'satisfied', explanation: null, cost_tokens: 1, completed_at: '' };
const submission = { skill_source: 'src', branch: 'b', commit_sha: 'c', submitted_at: '' };
const pending = { source_version: 3, skill_source: 'src', acted_as: 'p', branch: 'b', base_commit_sha: 'x', base_content_sha256: 'sha256:y', expected_base_digest: null, prepared_commit_sha: 'c', started_at: '' };

describe('SkillProposal consistency rules', () => {
  it('accepts every state as the service writes it', () => {
    const ok: SkillProposalDoc[] = [
      base,
      { ...base, status: 'authoring_failed', error: 'input_session_unavailable' },
      drafted,
      { ...drafted, status: 'verifying', verifications: [attempt] },
      { ...drafted, status: 'verified', verifications: [{ ...attempt, result }] },
      { ...drafted, status: 'verification_failed', verifications: [{ ...attempt, result: { ...result, verdict: 'needs_revision' } }] },
      { ...drafted, status: 'submitting', verifications: [{ ...attempt, result }], submission_attempt: pending },
      { ...drafted, status: 'submitted', verifications: [{ ...attempt, result }], submission_attempt: pending, submission },
      { ...drafted, status: 'submitted', verifications: [{ ...attempt, result }], submission, adoption: { skill_id: 'k', skill_version: 1, observed_at: '' } },
      { ...drafted, status: 'discarded' },
      { ...base, status: 'discarded', error: 'authoring_failed' },
    ];
    for (const p of ok) expect(consistencyViolation(p), p.status).toBeNull();
  });

  it('refuses a breach of each rule', () => {
    const bad: Array<[SkillProposalDoc, RegExp]> = [
      [{ ...drafted, error: 'internal' }, /error/],
      [{ ...base, status: 'authoring_failed' }, /error/],
      [{ ...base, status: 'drafted' }, /skill/],
      [{ ...drafted, status: 'authoring' }, /no skill/],
      [{ ...drafted, status: 'submitting', verifications: [{ ...attempt, result }] }, /submission_attempt/],
      [{ ...drafted, status: 'verified', verifications: [{ ...attempt, result }], submission_attempt: pending }, /submission_attempt/],
      [{ ...drafted, status: 'verified', verifications: [{ ...attempt, result }], submission }, /submission/],
      [{ ...drafted, status: 'submitted', verifications: [{ ...attempt, result }] }, /submission/],
      [{ ...drafted, adoption: { skill_id: 'k', skill_version: 1, observed_at: '' } }, /adoption/],
      [{ ...drafted, status: 'verifying' }, /attempt/],
      [{ ...drafted, status: 'verified', verifications: [attempt] }, /result/],
      [{ ...drafted, status: 'verified', verifications: [{ ...attempt, result: { ...result, verdict: 'failed' } }] }, /satisfied/],
    ];
    for (const [p, re] of bad) expect(consistencyViolation(p), p.status).toMatch(re);
  });

  it('shows exactly the contract\'s fields', () => {
    const view = publicProposal({ ...drafted, _content: 'secret', _through: 3 });
    expect(Object.keys(view).sort()).toEqual([
      'agent', 'created_at', 'id', 'instructions', 'model_routing_profile_key', 'skill', 'source_session_ids', 'status', 'updated_at', 'usage', 'verification_material', 'verifications', 'version',
    ]);
  });
});
