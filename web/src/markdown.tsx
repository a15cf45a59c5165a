// A small Markdown renderer that builds React elements, never HTML strings: whatever the
// model writes (including `<script>` or `<img onerror>`) ends up as text. It covers what
// chat answers use: paragraphs, headings, lists, fenced code, inline code, bold, italic
// and links (http, https and mailto only).

import type { ReactNode } from "react";

const SAFE_LINK = /^(https?:|mailto:)/i;

function inline(text: string, keyBase: string): ReactNode[] {
  const out: ReactNode[] = [];
  // Code first (its content is literal), then links, bold, italic.
  const pattern = /(`[^`\n]+`)|\[([^\]\n]+)\]\(([^)\s]+)\)|(\*\*[^*\n]+\*\*)|(\*[^*\n]+\*|_[^_\n]+_)/g;
  let last = 0;
  let n = 0;
  for (let m = pattern.exec(text); m !== null; m = pattern.exec(text)) {
    if (m.index > last) out.push(text.slice(last, m.index));
    const key = `${keyBase}-${n++}`;
    if (m[1]) {
      out.push(<code key={key}>{m[1].slice(1, -1)}</code>);
    } else if (m[2] !== undefined) {
      const href = m[3];
      out.push(
        SAFE_LINK.test(href) ? (
          <a key={key} href={href} target="_blank" rel="noopener noreferrer nofollow">
            {inline(m[2], key)}
          </a>
        ) : (
          m[0]
        ),
      );
    } else if (m[4]) {
      out.push(<strong key={key}>{inline(m[4].slice(2, -2), key)}</strong>);
    } else if (m[5]) {
      out.push(<em key={key}>{inline(m[5].slice(1, -1), key)}</em>);
    }
    last = m.index + m[0].length;
  }
  if (last < text.length) out.push(text.slice(last));
  return out;
}

/** Lines joined back inside a paragraph keep their breaks. */
function lines(text: string, keyBase: string): ReactNode[] {
  return text.split("\n").flatMap((line, i) => {
    const parts = inline(line, `${keyBase}-${i}`);
    return i === 0 ? parts : [<br key={`${keyBase}-br${i}`} />, ...parts];
  });
}

export function Markdown({ text }: { text: string }) {
  const blocks: ReactNode[] = [];
  const src = text.replace(/\r\n?/g, "\n").split("\n");
  let i = 0;
  while (i < src.length) {
    const line = src[i];
    const key = `b${blocks.length}`;
    const fence = /^\s*```(\S*)/.exec(line);
    if (fence) {
      const body: string[] = [];
      i++;
      while (i < src.length && !/^\s*```/.test(src[i])) body.push(src[i++]);
      i++; // the closing fence (or the end of a still-streaming block)
      blocks.push(
        <pre key={key}>
          <code>{body.join("\n")}</code>
        </pre>,
      );
      continue;
    }
    const heading = /^(#{1,6})\s+(.*)$/.exec(line);
    if (heading) {
      const level = Math.min(heading[1].length + 2, 6);
      const Tag = `h${level}` as "h3";
      blocks.push(<Tag key={key}>{inline(heading[2], key)}</Tag>);
      i++;
      continue;
    }
    const bullet = /^\s*([-*+]|\d+[.)])\s+/;
    if (bullet.test(line)) {
      const ordered = /^\s*\d/.test(line);
      const items: ReactNode[] = [];
      while (i < src.length && bullet.test(src[i])) {
        items.push(<li key={items.length}>{inline(src[i].replace(bullet, ""), `${key}-${items.length}`)}</li>);
        i++;
      }
      blocks.push(ordered ? <ol key={key}>{items}</ol> : <ul key={key}>{items}</ul>);
      continue;
    }
    if (line.trim() === "") {
      i++;
      continue;
    }
    const para: string[] = [];
    while (
      i < src.length &&
      src[i].trim() !== "" &&
      !/^\s*```/.test(src[i]) &&
      !/^#{1,6}\s/.test(src[i]) &&
      !bullet.test(src[i])
    ) {
      para.push(src[i++]);
    }
    blocks.push(<p key={key}>{lines(para.join("\n"), key)}</p>);
  }
  return <div className="md">{blocks}</div>;
}
