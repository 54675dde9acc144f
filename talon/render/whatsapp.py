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
            out.append(tok.with_url(_inline(tok.children)))
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
        text = plain_text(heading).strip()
        return f"*{text}*" if text else ""
    bullet = bullet_split(line)
    if bullet is not None:
        indent, item = bullet
        return f"{indent}- {_inline(parse_inline(item))}"
    return _inline(parse_inline(line))


def markdown_to_whatsapp(md: str) -> str:
    """Render markdown to WhatsApp text formatting."""
    return render_blocks(md, code=lambda block: "\n".join(["```", *block.body, "```"]), line=_line)


def split_for_whatsapp(text: str, limit: int = WHATSAPP_BODY_LIMIT) -> list[str]:
    """Pieces of at most ``limit`` characters: cut between paragraphs, lines, then words; a ```
    block that must be cut is closed and reopened in the next piece."""
    return split_markdown(text, limit, len)
