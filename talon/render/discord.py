"""The agent's markdown as Discord markdown, with a plain fallback, cut at Discord's 2,000
characters a message.

Discord's dialect is close to the agent's: ``**bold**``, ``*italic*``, ``~~strike~~``, `` `code` ``,
fenced blocks with a language, ``> `` quotes, ``#`` headings and masked links ``[text](<url>)``
(http and https only; other destinations are shown as text). Everything else in a text is
escaped with a backslash (``*``, ``_``, ``~``, `` ` ``, ``|``; ``>``, ``#``, ``-`` at a line start), so
a stray marker or a spoiler bar is shown as typed. Mentions are not escaped here: every message is
sent with ``allowed_mentions`` none, so ``@everyone`` or ``<@id>`` in an answer pings nobody.
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
    Url,
    bullet_split,
    heading_text,
    parse_inline,
    plain_text,
    render_blocks,
)
from talon.render.telegram import plain_text_fallback

__all__ = ["DISCORD_TEXT_LIMIT", "discord_plain", "markdown_to_discord", "split_for_discord"]

DISCORD_TEXT_LIMIT = 2000
_MARKERS = {"b": "**", "i": "*", "s": "~~"}
_SPECIAL = re.compile(r"([\\*_~`|])")
_LINE_START = re.compile(r"^(\s*)(>|#{1,3}(?= )|-(?= ))")
_LANGUAGE = re.compile(r"[A-Za-z0-9_+#.-]{1,32}")
_HEADING = re.compile(r" {0,3}(#{1,6})")


def _escape(text: str) -> str:
    return _SPECIAL.sub(r"\\\1", text)


def _inline(tokens: list[Token]) -> str:
    out: list[str] = []
    for tok in tokens:
        if isinstance(tok, Text):
            out.append(_escape(tok.text))
        elif isinstance(tok, Url):
            out.append(tok.text)  # a bare link Discord links itself
        elif isinstance(tok, Code):
            fence = "``" if "`" in tok.text else "`"
            out.append(f"{fence}{tok.text}{fence}" if fence == "`" else f"`` {tok.text} ``")
        elif isinstance(tok, Link):
            label = _inline(tok.children) or _escape(tok.url)
            url = tok.url.strip()
            if url.lower().startswith(("http://", "https://")) and not any(c in url for c in "<> )"):
                out.append(f"[{label}](<{url}>)")
            else:
                out.append(f"{label} ({_escape(url)})" if url else label)
        elif isinstance(tok, Delim):
            if not tok.role:
                out.append(_escape(tok.char * tok.count))
                continue
            tags = tok.tags if tok.role == "open" else tuple(reversed(tok.tags))
            out.extend(_MARKERS[t] for t in tags)
    return "".join(out)


def _line(line: str) -> str:
    heading = heading_text(line)
    if heading is not None:
        level = _HEADING.match(line)
        hashes = "#" * min(len(level.group(1)) if level else 3, 3)
        text = _escape(plain_text(heading).strip())
        return f"{hashes} {text}" if text else ""
    bullet = bullet_split(line)
    if bullet is not None:
        indent, item = bullet
        return f"{indent}- {_inline(parse_inline(item))}"
    return _LINE_START.sub(r"\1\\\2", _inline(parse_inline(line)), count=1)


def _code(block: CodeBlock) -> str:
    lang = block.language if block.language and _LANGUAGE.fullmatch(block.language) else ""
    body = "\n".join(block.body).replace("```", "`\u200b``")
    return f"```{lang}\n{body}\n```"


def markdown_to_discord(md: str) -> str:
    return render_blocks(md, code=_code, line=_line, quote=lambda lines: "\n".join("> " + x for x in lines))


def discord_plain(md: str) -> str:
    """The plain fallback: readable text without markup, markers escaped."""
    return _escape(plain_text_fallback(md))


def split_for_discord(md: str, limit: int = DISCORD_TEXT_LIMIT) -> list[str]:
    """Markdown pieces that each render to at most ``limit`` characters."""
    return split_markdown(md, limit, lambda piece: len(markdown_to_discord(piece)))
