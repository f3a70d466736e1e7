/**
 * Structured log lines name each field once. pino writes a child logger's bindings and the
 * fields of the call side by side, so a call that repeats a bound field (`runner` on a logger
 * already bound to its runner) or the logger's own `name` emits the key twice; a JSON parser then
 * keeps one of the two values and a log pipeline may keep either. `repeatedKeys` finds such keys
 * in one line (in objects at any depth); `linesRepeatingKeys` lists a log file's offending lines.
 */
import { readFileSync } from 'node:fs';

/** The keys an object in this JSON text repeats, in order of their second appearance. */
export function repeatedKeys(text: string): string[] {
  const found: string[] = [];
  let i = 0;
  const space = (): void => {
    while (i < text.length && (text[i] === ' ' || text[i] === '\n' || text[i] === '\r' || text[i] === '\t')) i++;
  };
  const string = (): string => {
    const start = ++i;
    while (i < text.length && text[i] !== '"') i += text[i] === '\\' ? 2 : 1;
    return text.slice(start, i++);
  };
  const value = (): void => {
    space();
    const c = text[i];
    if (c === '{' || c === '[') {
      const object = c === '{';
      const close = object ? '}' : ']';
      const seen = new Set<string>();
      i++;
      space();
      if (text[i] === close) {
        i++;
        return;
      }
      while (i < text.length) {
        if (object) {
          space();
          const key = string();
          if (seen.has(key)) found.push(key);
          seen.add(key);
          space();
          i++; // ':'
        }
        value();
        space();
        if (text[i++] !== ',') return;
      }
      return;
    }
    if (c === '"') {
      string();
      return;
    }
    while (i < text.length && !',}] \n\r\t'.includes(text[i] as string)) i++;
  };
  value();
  return found;
}

/**
 * The lines of a log file that are JSON objects repeating a key (lines that are not JSON, such as
 * one cut short by a kill, are skipped; a file no longer there has none).
 */
export function linesRepeatingKeys(file: string): string[] {
  let text: string;
  try {
    text = readFileSync(file, 'utf8');
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === 'ENOENT') return [];
    throw err;
  }
  const out: string[] = [];
  for (const line of text.split('\n')) {
    if (!line.startsWith('{')) continue;
    try {
      JSON.parse(line);
    } catch {
      continue;
    }
    if (repeatedKeys(line).length > 0) out.push(line);
  }
  return out;
}
