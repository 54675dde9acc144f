"""The agent's markdown as Slack ``mrkdwn``, with a plain fallback, cut to a size Slack shows
whole.

Slack's dialect has single markers (``*bold*``, ``_italic_``, ``~strike~``), `` `code` `` and
```` ``` ```` blocks, ``> `` quotes and links written ``<url|text>``. Three characters must be
escaped in text: ``&``, ``<`` and ``>`` (``&amp;``, ``&lt;``, ``&gt;``): otherwise a person's or
the model's ``<!channel>`` or ``<@U123>`` would ping people. Links are kept only for http, https
and mailto (other destinations are shown as text, never as a link); a link's text may contain
neither ``|`` nor ``>``. Headings become bold lines, bullets ``•``. Code is escaped but not
otherwise transformed (Slack shows a code block's text literally).

Slack truncates a message's ``text`` over 40,000 characters and advises staying under 4,000;
pieces are cut at ``SLACK_TEXT_LIMIT`` rendered characters (``split_for_slack``).
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
    plain_text,
    quoted,
    render_blocks,
)
from talon.render.telegram import plain_text_fallback

__all__ = ["SLACK_TEXT_LIMIT", "escape", "markdown_to_mrkdwn", "slack_plain", "split_for_slack"]

SLACK_TEXT_LIMIT = 4000
_MARKERS = {"b": "*", "i": "_", "s": "~"}
_LINK_SCHEMES = ("http://", "https://", "mailto:")


def escape(text: str) -> str:
    """Text Slack shows as written: no mention, no link, no special command."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _link(url: str, label: str) -> str:
    url = url.strip()
    if not url.lower().startswith(_LINK_SCHEMES) or any(c in url for c in "<>| \n"):
        return f"{label} ({escape(url)})" if url and label != escape(url) else label
    label = label.replace("|", "\N{FULLWIDTH VERTICAL LINE}")
    url = url.replace("&", "&amp;")
    return f"<{url}|{label}>" if label else f"<{url}>"


def _inline(tokens: list[Token]) -> str:
    out: list[str] = []
    for tok in tokens:
        if isinstance(tok, (Text, Url)):
            out.append(escape(tok.text))
        elif isinstance(tok, Code):
            out.append(f"`{escape(tok.text)}`")
        elif isinstance(tok, Link):
            out.append(_link(tok.url, _inline(tok.children) or escape(tok.url)))
        elif isinstance(tok, Delim):
            if not tok.role:
                out.append(escape(tok.char * tok.count))
                continue
            tags = tok.tags if tok.role == "open" else tuple(reversed(tok.tags))
            out.extend(_MARKERS[t] for t in tags)
    return "".join(out)


def _line(line: str) -> str:
    heading = heading_text(line)
    if heading is not None:
        text = escape(plain_text(heading).strip())
        return f"*{text}*" if text else ""
    bullet = bullet_split(line)
    if bullet is not None:
        indent, item = bullet
        return f"{indent}• {_inline(parse_inline(item))}"
    return _inline(parse_inline(line))


def _code(block: CodeBlock) -> str:
    return "\n".join(["```", *(escape(line) for line in block.body), "```"])


def markdown_to_mrkdwn(md: str) -> str:
    """``md`` in Slack's mrkdwn (see the module docstring); one output line per source line."""
    return render_blocks(md, code=_code, line=_line, quote=quoted)


def slack_plain(md: str) -> str:
    """The plain fallback (sent with ``mrkdwn: false`` when Slack refuses the formatted text, and
    the notification text): readable, escaped, no markup."""
    return escape(plain_text_fallback(md))


def split_for_slack(md: str, limit: int = SLACK_TEXT_LIMIT) -> list[str]:
    """Markdown pieces that each render to at most ``limit`` characters of mrkdwn."""
    return split_markdown(md, limit, lambda piece: len(markdown_to_mrkdwn(piece)))
