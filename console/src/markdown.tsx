/**
 * Markdown for agent and user messages: marked's lexer makes tokens, and this renders them as
 * Preact elements. Text always becomes text nodes; raw HTML in a message is shown as text, never
 * injected; links keep only http(s)/mailto targets and open without a referrer.
 */
import { Lexer, type Token, type Tokens } from 'marked';
import type { ComponentChildren, JSX } from 'preact';
import { memo } from 'preact/compat';

function safeHref(href: string): string | null {
  try {
    const u = new URL(href, location.origin);
    return ['http:', 'https:', 'mailto:'].includes(u.protocol) ? u.href : null;
  } catch {
    return null;
  }
}

function inline(tokens: Token[] | undefined, fallback: string): ComponentChildren {
  if (!tokens) return fallback;
  return tokens.map((t, i) => renderInline(t, i));
}

function renderInline(t: Token, key: number): ComponentChildren {
  switch (t.type) {
    case 'strong':
      return <strong key={key}>{inline((t as Tokens.Strong).tokens, (t as Tokens.Strong).text)}</strong>;
    case 'em':
      return <em key={key}>{inline((t as Tokens.Em).tokens, (t as Tokens.Em).text)}</em>;
    case 'del':
      return <del key={key}>{inline((t as Tokens.Del).tokens, (t as Tokens.Del).text)}</del>;
    case 'codespan':
      return <code key={key}>{(t as Tokens.Codespan).text}</code>;
    case 'br':
      return <br key={key} />;
    case 'link': {
      const l = t as Tokens.Link;
      const href = safeHref(l.href);
      const children = inline(l.tokens, l.text);
      return href ? <a key={key} href={href} target="_blank" rel="noopener noreferrer">{children}</a> : <span key={key}>{children}</span>;
    }
    case 'image': {
      const im = t as Tokens.Image;
      return <span key={key}>[image: {im.text || im.href}]</span>;
    }
    case 'escape':
      return (t as Tokens.Escape).text;
    case 'text': {
      const tx = t as Tokens.Text;
      return tx.tokens ? <span key={key}>{inline(tx.tokens, tx.text)}</span> : tx.text;
    }
    default:
      return 'raw' in t ? t.raw : '';
  }
}

function renderBlock(t: Token, key: number): JSX.Element | string | null {
  switch (t.type) {
    case 'space':
      return null;
    case 'heading': {
      const h = t as Tokens.Heading;
      const Tag = `h${Math.min(6, h.depth + 2)}` as 'h3';
      return <Tag key={key} class="md-h">{inline(h.tokens, h.text)}</Tag>;
    }
    case 'paragraph':
      return <p key={key}>{inline((t as Tokens.Paragraph).tokens, (t as Tokens.Paragraph).text)}</p>;
    case 'code': {
      const c = t as Tokens.Code;
      return (
        <pre key={key} class="code" tabIndex={0} aria-label={c.lang ? `${c.lang} code` : 'code'}>
          {c.lang ? <span class="code-lang">{c.lang}</span> : null}
          <code>{c.text}</code>
        </pre>
      );
    }
    case 'blockquote':
      return <blockquote key={key}>{blocks((t as Tokens.Blockquote).tokens)}</blockquote>;
    case 'list': {
      const l = t as Tokens.List;
      const items = l.items.map((it, i) => <li key={i}>{blocks(it.tokens)}</li>);
      return l.ordered ? <ol key={key} start={typeof l.start === 'number' ? l.start : 1}>{items}</ol> : <ul key={key}>{items}</ul>;
    }
    case 'table': {
      const tb = t as Tokens.Table;
      return (
        <div key={key} class="table-wrap">
          <table>
            <thead><tr>{tb.header.map((c, i) => <th key={i}>{inline(c.tokens, c.text)}</th>)}</tr></thead>
            <tbody>{tb.rows.map((r, i) => <tr key={i}>{r.map((c, j) => <td key={j}>{inline(c.tokens, c.text)}</td>)}</tr>)}</tbody>
          </table>
        </div>
      );
    }
    case 'hr':
      return <hr key={key} />;
    case 'html':
      return <p key={key}>{(t as Tokens.HTML).text}</p>;
    case 'text': {
      const tx = t as Tokens.Text;
      return <span key={key}>{inline(tx.tokens, tx.text)}</span>;
    }
    default:
      return 'raw' in t ? <p key={key}>{t.raw}</p> : null;
  }
}

function blocks(tokens: Token[]): (JSX.Element | string | null)[] {
  return tokens.map((t, i) => renderBlock(t, i));
}

export const Markdown = memo(function Markdown({ text }: { text: string }) {
  let tokens: Token[];
  try {
    tokens = Lexer.lex(text, { gfm: true, breaks: true });
  } catch {
    return <p>{text}</p>;
  }
  return <div class="md">{blocks(tokens)}</div>;
});
