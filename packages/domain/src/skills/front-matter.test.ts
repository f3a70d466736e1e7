import { describe, expect, it } from 'vitest';
import { parseFrontMatter, renderSkillMd } from './model.js';

describe('SKILL.md front matter', () => {
  it('reads back the description a rendered SKILL.md was given, quotes and escapes included', () => {
    for (const description of ['Greets visitors in the house style.', 'Says "hello" to: everyone', "It's #1 for 'csv' files", 'C:\\path\\to a \\"file\\"', ' padded ']) {
      const text = renderSkillMd('house-greeting', description, 'Body.');
      expect(parseFrontMatter(text)).toMatchObject({ name: 'house-greeting', description });
    }
  });

  it('reads YAML double-quoted escapes and takes single-quoted values as written', () => {
    expect(parseFrontMatter('---\nname: a\ndescription: "Say \\"hi\\" \\u00e9"\n---\nx').description).toBe('Say "hi" é');
    expect(parseFrontMatter("---\nname: a\ndescription: 'It''s fine'\n---\nx").description).toBe("It's fine");
    expect(parseFrontMatter('---\nname: a\ndescription: "plain"\n---\nx').description).toBe('plain');
    expect(parseFrontMatter('---\nname: a\ndescription: no "quotes" around\n---\nx').description).toBe('no "quotes" around');
  });
});
