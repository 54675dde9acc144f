"""The Matrix channel's pure parts and the shared channel pieces, with values (issue 32)."""

from __future__ import annotations

from html.parser import HTMLParser

import pytest

from channels.matrix.api import check
from channels.matrix.downloads import media_path
from channels.matrix.intake import strip_reply_fallback, thread_of, _command
from channels.reply_parts import FilePart, NoticePart, ReplyDocumentPart, RetirePart, TextPart, plan_reply_parts
from channels.rooms import ChatterLog, parse_allowed
from talon.config import Settings
from talon.envelope import OutboundReply
from talon.errors import ConfigError, DeliveryError, PlatformRateLimited
from talon.media import MarkdownMediaRef
from talon.render.matrix import markdown_to_matrix_html, matrix_plain, split_for_matrix


class _Balance(HTMLParser):
    VOID = {"br"}

    def __init__(self) -> None:
        super().__init__()
        self.stack: list[str] = []
        self.tags: set[str] = set()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.add(tag)
        if tag not in self.VOID:
            self.stack.append(tag)

    def handle_endtag(self, tag: str) -> None:
        assert self.stack and self.stack.pop() == tag, f"unbalanced </{tag}>"


def balanced(html: str) -> set[str]:
    parser = _Balance()
    parser.feed(html)
    parser.close()
    assert not parser.stack, f"left open: {parser.stack}"
    return parser.tags


def test_matrix_html_renders_the_dialect_and_escapes_everything_else() -> None:
    html = markdown_to_matrix_html("# Plan\n**bold** _it_ ~~gone~~ `x<y` <img src=x onerror=alert(1)>\n"
                                   "[ok](https://example.org) [bad](javascript:alert(1))\n\n```py\na < b\n```")
    assert "<h1>Plan</h1>" in html and "<strong>bold</strong>" in html and "<em>it</em>" in html
    assert "<del>gone</del>" in html and "<code>x&lt;y</code>" in html
    assert "<img" not in html and "&lt;img" in html
    assert '<a href="https://example.org">ok</a>' in html and 'href="javascript' not in html
    assert '<pre><code class="language-py">a &lt; b</code></pre>' in html
    assert balanced(html) <= {"h1", "strong", "em", "del", "code", "a", "br", "pre"}
    assert matrix_plain("**bold** [ok](https://example.org)") == "bold ok (https://example.org)"


@pytest.mark.parametrize("md", ["**open", "*a **b* c**", "```\nunclosed", "> q\n> **x", "[a](b", "_a *b_ c*"])
def test_matrix_html_is_well_formed_for_broken_markup(md: str) -> None:
    balanced(markdown_to_matrix_html(md))


def test_a_long_answer_is_cut_under_the_limit_with_code_blocks_closed() -> None:
    md = "intro\n\n```\n" + "\n".join(f"line {i} <&>" for i in range(400)) + "\n```"
    pieces = split_for_matrix(md, 1000)
    assert len(pieces) > 3
    for piece in pieces:
        assert len(markdown_to_matrix_html(piece)) <= 1000
        balanced(markdown_to_matrix_html(piece))


def test_reply_parts_are_a_function_of_the_reply_alone() -> None:
    reply = OutboundReply(text="hello", media=[MarkdownMediaRef(alt="r", path="r.txt")], notices=["note"],
                          live_message_id="$live")
    parts = plan_reply_parts(reply, lambda t: [t] if t else [], 8)
    assert parts == [TextPart("hello", edit="$live"), FilePart(MarkdownMediaRef(alt="r", path="r.txt")),
                     NoticePart("note")]
    assert plan_reply_parts(reply, lambda t: [t] if t else [], 8) == parts
    empty = plan_reply_parts(OutboundReply(text="", live_message_id="$live"), lambda t: [], 8)
    assert empty == [RetirePart("$live")]
    long = plan_reply_parts(OutboundReply(text="x"), lambda t: ["a", "b", "c"], 2)
    assert long[0] == TextPart("a") and isinstance(long[1], ReplyDocumentPart)


@pytest.mark.parametrize("mxc", ["mxc://evil.example/../../admin", "mxc://a/b/c", "https://x/y", "mxc://a/b?x=1",
                                 "mxc:///id", "mxc://a b/c"])
def test_a_hostile_mxc_uri_is_never_fetched(mxc: str) -> None:
    assert media_path(mxc) is None


def test_a_plain_mxc_uri_maps_to_the_authenticated_media_path() -> None:
    assert media_path("mxc://localhost/AbC_d-1") == "/_matrix/client/v1/media/download/localhost/AbC_d-1"


def test_threads_replies_and_bang_commands() -> None:
    assert thread_of({"m.relates_to": {"rel_type": "m.thread", "event_id": "$root"}}) == "$root"
    assert thread_of({"m.relates_to": {"m.in_reply_to": {"event_id": "$x"}}}) is None
    assert strip_reply_fallback("> <@a:x> earlier\n> more\n\nmy answer") == "my answer"
    assert _command("!stop") == "/stop" and _command("! not a command") == "! not a command"
    assert _command("/new") == "/new"


def test_rate_limits_and_refusals_from_nio_become_our_errors() -> None:
    from nio import RoomSendError

    with pytest.raises(PlatformRateLimited) as limited:
        check(RoomSendError("slow down", "M_LIMIT_EXCEEDED", retry_after_ms=1500), "send")
    assert limited.value.seconds == 1.5
    with pytest.raises(DeliveryError) as refused:
        check(RoomSendError("no", "M_FORBIDDEN"), "send")
    assert refused.value.permanent and "M_FORBIDDEN" in str(refused.value)


def test_room_settings_are_checked_and_empty_means_none() -> None:
    settings = Settings(_env_file=None, TALON_MATRIX_ALLOWED_ROOMS="!abc:example.org, !Xyz123")  # type: ignore[call-arg]
    assert settings.matrix_allowed_room_ids == {"!abc:example.org", "!Xyz123"}
    with pytest.raises(ConfigError, match="TALON_MATRIX_ALLOWED_ROOMS"):
        _ = Settings(_env_file=None, TALON_MATRIX_ALLOWED_ROOMS="#general:example.org").matrix_allowed_room_ids  # type: ignore[call-arg]
    assert parse_allowed(" a, ,b ") == {"a", "b"} and parse_allowed("") == frozenset()
    assert Settings(_env_file=None, TALON_MATRIX_ALLOWED_USERS="@Alice:Example.org").matrix_allowlist == {  # type: ignore[call-arg]
        "@alice:example.org"}


def test_chatter_is_kept_per_conversation_and_taken_once() -> None:
    log = ChatterLog(2)
    for text in ("one", "two", "three"):
        log.add("room", "carol", text)
    assert [c.text for c in log.take("room")] == ["two", "three"]
    assert log.take("room") == []
