import type { ToolSpec } from '@agentplane/protocol';

/**
 * `ask_user`: the agent asks its user one or more questions. It never runs in the sandbox: a use
 * ends the Run with `requires_action` and waits for `user.question_answer` (docs/OUTCOMES.md,
 * "Questions"). A malformed input is answered at once with an error result and does not wait.
 */
export const QUESTION_TOOL_NAME = 'ask_user';

export const QUESTION_LIMITS = { maxQuestions: 8, maxQuestionChars: 2000, maxOptions: 16, maxOptionChars: 200 } as const;

export const questionToolSpec: ToolSpec = {
  name: QUESTION_TOOL_NAME,
  description:
    'Ask the user one or more questions and wait for the answers. Each question is free text, or a choice among options ' +
    '(one or several with `multiple`, optionally with an `allow_other` free-text answer). The user may decline to answer.',
  input_schema: {
    type: 'object',
    additionalProperties: false,
    required: ['questions'],
    properties: {
      questions: {
        type: 'array',
        minItems: 1,
        maxItems: QUESTION_LIMITS.maxQuestions,
        items: {
          type: 'object',
          additionalProperties: false,
          required: ['question'],
          properties: {
            question: { type: 'string', minLength: 1, maxLength: QUESTION_LIMITS.maxQuestionChars },
            options: { type: 'array', maxItems: QUESTION_LIMITS.maxOptions, items: { type: 'string', minLength: 1, maxLength: QUESTION_LIMITS.maxOptionChars } },
            multiple: { type: 'boolean' },
            allow_other: { type: 'boolean' },
          },
        },
      },
    },
  },
};

/** Why a question input is unusable, or null when it is well formed. */
export function questionInputError(input: unknown): string | null {
  if (typeof input !== 'object' || input === null || Array.isArray(input)) return 'input must be an object';
  const rec = input as Record<string, unknown>;
  for (const k of Object.keys(rec)) if (k !== 'questions') return `unknown field '${k}'`;
  const qs = rec.questions;
  if (!Array.isArray(qs) || qs.length === 0 || qs.length > QUESTION_LIMITS.maxQuestions) return `'questions' must hold 1 to ${QUESTION_LIMITS.maxQuestions} questions`;
  for (const [i, q] of qs.entries()) {
    if (typeof q !== 'object' || q === null || Array.isArray(q)) return `questions[${i}] must be an object`;
    const r = q as Record<string, unknown>;
    for (const k of Object.keys(r)) if (!['question', 'options', 'multiple', 'allow_other'].includes(k)) return `questions[${i}]: unknown field '${k}'`;
    if (typeof r.question !== 'string' || r.question.length === 0 || r.question.length > QUESTION_LIMITS.maxQuestionChars) return `questions[${i}].question must be 1 to ${QUESTION_LIMITS.maxQuestionChars} characters`;
    if (r.options !== undefined) {
      if (!Array.isArray(r.options) || r.options.length > QUESTION_LIMITS.maxOptions || !r.options.every((o) => typeof o === 'string' && o.length > 0 && o.length <= QUESTION_LIMITS.maxOptionChars)) {
        return `questions[${i}].options must be up to ${QUESTION_LIMITS.maxOptions} strings`;
      }
    }
    for (const k of ['multiple', 'allow_other'] as const) if (r[k] !== undefined && typeof r[k] !== 'boolean') return `questions[${i}].${k} must be a boolean`;
  }
  return null;
}
