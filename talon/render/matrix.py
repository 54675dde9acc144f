"""The agent's markdown as a Matrix message: ``body`` (plain text, the fallback every client
shows) and ``formatted_body`` (``format: org.matrix.custom.html``, the HTML subset the
specification recommends), cut to a size a homeserver takes.

Every piece of text is escaped and every tag comes from a paired delimiter
(``talon.render.markdown``), so the HTML is always well formed: ``<strong>``, ``<em>``, ``<del>``,
``<code>``, ``<pre><code class="language-x">``, ``<blockquote>``, ``<a href>`` (http, https,
mailto and matrix.to only; other destinations are shown as text), headings as ``<h1>``-``<h6>``,
and lines joined by ``<br>`` (HTML collapses newlines). A Matrix event may be at most 65,536
bytes of JSON; a message is cut at ``MATRIX_TEXT_LIMIT`` characters of HTML so that both bodies
and the event's envelope fit with room to spare.
"""

from __future__ import annotations

import re

from talon.render.chunking import split_markdown
from talon.render.markdown import (
    Code,
    CodeBlock,
    Delim,
    Link,
    Text,
    Token,
    QuoteBlock,
    Url,
    bullet_split,
    heading_text,
    iter_blocks,
    parse_inline,
)
from talon.render.telegram import plain_text_fallback

__all__ = ["MATRIX_TEXT_LIMIT", "markdown_to_matrix_html", "matrix_plain", "split_for_matrix"]

MATRIX_TEXT_LIMIT = 16_000
_ALLOWED_SCHEMES = ("http://", "https://", "mailto:", "https://matrix.to/")
_TAG = {"b": "strong", "i": "em", "s": "del"}
_HEADING_LEVEL = re.compile(r" {0,3}(#{1,6})")
_LANGUAGE = re.compile(r"[A-Za-z0-9_+#.-]{1,32}")


def _escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _attr(text: str) -> str:
    return _escape(text).replace('"', "&quot;")


def _inline(tokens: list[Token]) -> str:
    out: list[str] = []
    for tok in tokens:
        if isinstance(tok, (Text, Url)):
            out.append(_escape(tok.text))
        elif isinstance(tok, Code):
            out.append(f"<code>{_escape(tok.text)}</code>")
        elif isinstance(tok, Link):
            inner = _inline(tok.children) or _escape(tok.url)
            url = tok.url.strip()
            if url.lower().startswith(_ALLOWED_SCHEMES):
                out.append(f'<a href="{_attr(url.replace(" ", "%20"))}">{inner}</a>')
            else:
                out.append(f"{inner} ({_escape(tok.url)})" if tok.url else inner)
        elif isinstance(tok, Delim):
            if not tok.role:
                out.append(_escape(tok.char * tok.count))
            elif tok.role == "open":
                out.extend(f"<{_TAG[t]}>" for t in tok.tags)
            else:
                out.extend(f"</{_TAG[t]}>" for t in reversed(tok.tags))
    return "".join(out)


def _line(line: str) -> str:
    heading = heading_text(line)
    if heading is not None:
        level = _HEADING_LEVEL.match(line)
        n = len(level.group(1)) if level else 3
        inner = _inline(parse_inline(heading))
        return f"<h{n}>{inner}</h{n}>" if inner else ""
    bullet = bullet_split(line)
    if bullet is not None:
        indent, item = bullet
        return f"{'&nbsp;' * len(indent)}• {_inline(parse_inline(item))}"
    return _inline(parse_inline(line))


def _code(block: CodeBlock) -> str:
    body = _escape("\n".join(block.body))
    lang = block.language
    if lang and _LANGUAGE.fullmatch(lang):
        return f'<pre><code class="language-{lang}">{body}</code></pre>'
    return f"<pre><code>{body}</code></pre>"


def _quote(lines: list[str]) -> str:
    return "<blockquote>" + "<br>".join(lines) + "</blockquote>"


def markdown_to_matrix_html(md: str) -> str:
    """``formatted_body`` for ``md``; always well formed, whatever the input. Source lines are
    joined by ``<br>`` except next to a block element (code, quote, heading), which breaks the
    line itself; a code block keeps its own newlines inside ``<pre>``."""
    out: list[str] = []
    previous_block = True  # nothing before: no <br> needed
    for block in iter_blocks(md):
        if isinstance(block, CodeBlock):
            html, is_block = _code(block), True
        elif isinstance(block, QuoteBlock):
            html, is_block = _quote([_line(text) for text in block.lines]), True
        else:
            html = _line(block.text)
            is_block = html.startswith("<h") and html.endswith(">") and html[2:3].isdigit()
        if out and not previous_block and not is_block:
            out.append("<br>")
        out.append(html)
        previous_block = is_block
    return "".join(out)


def matrix_plain(md: str) -> str:
    """``body``: readable text without markup (also what a client without HTML shows)."""
    return plain_text_fallback(md)


def split_for_matrix(md: str, limit: int = MATRIX_TEXT_LIMIT) -> list[str]:
    """Markdown pieces that each render to at most ``limit`` characters of HTML."""
    return split_markdown(md, limit, lambda piece: len(markdown_to_matrix_html(piece)))
