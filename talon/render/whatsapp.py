"""The agent's markdown as WhatsApp formatting, cut to Twilio's body limit.

WhatsApp styles with single markers: *bold*, _italic_, ~strike~ and ```monospace```. It has no
links and no headings, so links become "text (url)" and headings bold lines. Code is never
transformed: a fenced block becomes a ``` block with its lines untouched (the language tag has no
place in WhatsApp), an inline code span becomes ```span```.
"""

from __future__ import annotations

from talon.render.chunking import split_markdown
from talon.render.markdown import (
    Code,
    CodeBlock,
    Delim,
    Line,
    Link,
    QuoteBlock,
    Text,
    Token,
    Url,
    bullet_split,
    heading_text,
    iter_blocks,
    parse_inline,
    plain_of,
)

__all__ = ["WHATSAPP_BODY_LIMIT", "markdown_to_whatsapp", "split_for_whatsapp"]

WHATSAPP_BODY_LIMIT = 1600
_MARKERS = {"b": "*", "i": "_", "s": "~"}


def _inline(tokens: list[Token]) -> str:
    out: list[str] = []
    for tok in tokens:
        if isinstance(tok, (Text, Url)):
            out.append(tok.text)
        elif isinstance(tok, Code):
            out.append(f"```{tok.text}```")
        elif isinstance(tok, Link):
            text = _inline(tok.children)
            plain = tok.plain()
            out.append(tok.url if not plain or plain == tok.url else f"{text} ({tok.url})")
        elif isinstance(tok, Delim):
            if not tok.role:
                out.append(tok.char * tok.count)
                continue
            tags = tok.tags if tok.role == "open" else tuple(reversed(tok.tags))
            out.extend(_MARKERS[t] for t in tags)
    return "".join(out)


def _line(line: str) -> str:
    heading = heading_text(line)
    if heading is not None:
        text = "".join(plain_of(t) for t in parse_inline(heading)).strip()
        return f"*{text}*" if text else ""
    bullet = bullet_split(line)
    if bullet is not None:
        indent, item = bullet
        return f"{indent}- {_inline(parse_inline(item))}"
    return _inline(parse_inline(line))


def markdown_to_whatsapp(md: str) -> str:
    """Render markdown to WhatsApp text formatting."""
    out: list[str] = []
    for block in iter_blocks(md):
        if isinstance(block, CodeBlock):
            out.append("\n".join(["```", *block.body, "```"]))
        elif isinstance(block, QuoteBlock):
            out.append("\n".join("> " + _line(line) for line in block.lines))
        else:
            assert isinstance(block, Line)
            out.append(_line(block.text))
    return "\n".join(out)


def split_for_whatsapp(text: str, limit: int = WHATSAPP_BODY_LIMIT) -> list[str]:
    """Pieces of at most ``limit`` characters: cut between paragraphs, lines, then words; a ```
    block that must be cut is closed and reopened in the next piece."""
    return split_markdown(text, limit, len)
