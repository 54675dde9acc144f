"""The agent's markdown as Telegram's HTML subset (parse_mode=HTML), cut to Telegram's limits.

Telegram accepts only a handful of tags and refuses the whole message on one unbalanced tag or
stray ``<``, so every piece of text is escaped and every tag comes from a paired delimiter (see
``talon.render.markdown``). Links keep only the schemes Telegram opens (http, https, tg, mailto);
any other destination is shown as text.

Lengths are counted in UTF-16 code units, as the Bot API does: an emoji outside the BMP is two.
"""

from __future__ import annotations

from talon.render.chunking import split_markdown
from talon.render.markdown import (
    Code,
    CodeBlock,
    Delim,
    Link,
    Text,
    Token,
    Url,
    bullet_split,
    heading_text,
    parse_inline,
    plain_of,
    plain_text,
    render_blocks,
)

__all__ = [
    "TELEGRAM_TEXT_LIMIT",
    "markdown_to_telegram_html",
    "plain_text_fallback",
    "split_markdown_for_telegram",
    "utf16_len",
]

TELEGRAM_TEXT_LIMIT = 4096
_ALLOWED_SCHEMES = ("http://", "https://", "tg://", "mailto:")


def utf16_len(text: str) -> int:
    """Length in UTF-16 code units (what Telegram's limits count)."""
    return len(text.encode("utf-16-le", "surrogatepass")) // 2


def _escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _escape_attr(text: str) -> str:
    return _escape(text).replace('"', "&quot;")


def _href(url: str) -> str | None:
    url = url.strip()
    if not url.lower().startswith(_ALLOWED_SCHEMES):
        return None
    return url.replace(" ", "%20")


def _inline_html(tokens: list[Token], *, in_bold: bool = False) -> str:
    out: list[str] = []
    for tok in tokens:
        if isinstance(tok, (Text, Url)):
            out.append(_escape(tok.text))
        elif isinstance(tok, Code):
            out.append(f"<code>{_escape(tok.text)}</code>")
        elif isinstance(tok, Link):
            inner = _inline_html(tok.children, in_bold=in_bold) or _escape(tok.url)
            href = _href(tok.url)
            if href is None:
                # Telegram rejects other hrefs; keep the destination readable instead.
                out.append(f"{inner} ({_escape(tok.url)})" if tok.url else inner)
            else:
                out.append(f'<a href="{_escape_attr(href)}">{inner}</a>')
        elif isinstance(tok, Delim):
            if not tok.role:
                out.append(_escape(tok.char * tok.count))
                continue
            # A heading is already bold; Telegram needs no bold inside it.
            tags = [t for t in tok.tags if not (in_bold and t == "b")]
            if tok.role == "open":
                out.extend(f"<{t}>" for t in tags)
            else:
                out.extend(f"</{t}>" for t in reversed(tags))
    return "".join(out)


def _line_html(line: str) -> str:
    heading = heading_text(line)
    if heading is not None:
        inner = _inline_html(parse_inline(heading), in_bold=True)
        return f"<b>{inner}</b>" if inner else ""
    bullet = bullet_split(line)
    if bullet is not None:
        indent, item = bullet
        return f"{indent}• {_inline_html(parse_inline(item))}"
    return _inline_html(parse_inline(line))


def _code_block_html(block: CodeBlock) -> str:
    body = _escape("\n".join(block.body))
    lang = block.language
    if lang:
        return f'<pre><code class="language-{lang}">{body}</code></pre>'
    return f"<pre>{body}</pre>"


def markdown_to_telegram_html(md: str) -> str:
    """Render markdown to Telegram HTML; always well-formed, whatever the input."""
    return render_blocks(md, code=_code_block_html, line=_line_html,
                         quote=lambda lines: "<blockquote>" + "\n".join(lines) + "</blockquote>")


def split_markdown_for_telegram(md: str, limit: int = TELEGRAM_TEXT_LIMIT) -> list[str]:
    """Markdown pieces that each render to at most ``limit`` UTF-16 units of Telegram HTML."""
    return split_markdown(md, limit, lambda piece: utf16_len(markdown_to_telegram_html(piece)))


def _plain_line(line: str) -> str:
    heading = heading_text(line)
    if heading is not None:
        return plain_text(heading)
    bullet = bullet_split(line)
    if bullet is not None:
        indent, item = bullet
        line = item
        prefix = f"{indent}• "
    else:
        prefix = ""
    parts = [tok.with_url() if isinstance(tok, Link) else plain_of(tok) for tok in parse_inline(line)]
    return prefix + "".join(parts)


def plain_text_fallback(md: str) -> str:
    """Readable text without markup, for when Telegram refuses the HTML."""
    return render_blocks(md, code=lambda block: "\n".join(block.body), line=_plain_line)
