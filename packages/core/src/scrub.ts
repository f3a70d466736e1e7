/** What a scrubbed secret (or a recognisable part of it) is replaced with. */
export const REDACTED = '[redacted]';

/** Shortest run of a secret's characters that counts as an echo of it. */
const RUN = 8;
/**
 * A word (a run of characters other than white space, quotes and brackets), and a run of mask
 * characters inside one. Masked echoes are looked for word by word, each word read once: a
 * pattern looking for the mask run from every position of a long word (an upstream's error body
 * without white space) takes time quadratic in the word's length.
 */
const WORD = /[^\s"'`,;()<>[\]{}]+/g;
const MASK_RUN = /[*•…]{3,}/;

/**
 * `text` with every echo of `secret` taken out: the secret itself, any run of 8 or more of its
 * characters (a key quoted without its prefix, or cut short), and a masked echo, a word whose
 * visible ends are the secret's own around a run of mask characters (`sk-ab*****wxyz`,
 * `sk-proj-****…2345`, `sk-ab...wxyz`). For messages that came from elsewhere (a provider's error, an MCP
 * server's error) and may quote the credential sent to it.
 */
export function scrubSecret(text: string, secret: string | null | undefined): string {
  if (!secret || text.length === 0) return text;
  let out = text.split(secret).join(REDACTED);
  if (secret.length >= RUN) {
    const grams = new Set<string>();
    for (let i = 0; i + RUN <= secret.length; i++) grams.add(secret.slice(i, i + RUN));
    let kept = '';
    let i = 0;
    while (i < out.length) {
      if (i + RUN <= out.length && grams.has(out.slice(i, i + RUN))) {
        let j = i + RUN;
        while (j < out.length && secret.includes(out.slice(i, j + 1))) j++;
        kept += REDACTED;
        i = j;
      } else {
        kept += out[i];
        i++;
      }
    }
    out = kept;
  }
  const masked = out.replace(WORD, (found) => {
    // Three or more ASCII dots mask as `…` does (`sk-ab...wxyz`).
    const word = found.replace(/\.{3,}/g, '***');
    if (!MASK_RUN.test(word)) return found;
    const m = /^([^*•…]*)[*•…]+([^*•…]*)$/.exec(word);
    if (!m) return found;
    const head = m[1] ?? '';
    const tail = m[2] ?? '';
    const echoes = (head.length >= 3 && secret.startsWith(head)) || (tail.length >= 4 && secret.endsWith(tail));
    return echoes ? REDACTED : found;
  });
  // Parts of one echo taken out in turn (a run, then its masked rest) read as one.
  return masked.replace(/(?:\[redacted\]){2,}/g, REDACTED);
}

/** Every secret of `secrets` scrubbed from `text` (see scrubSecret). */
export function scrubSecrets(text: string, secrets: Iterable<string>): string {
  let out = text;
  for (const s of secrets) out = scrubSecret(out, s);
  return out;
}
