"""The platform-neutral parts of live replies, tested with values: where a partial answer may be
cut, and how LiveText paces, replaces and stops its updates."""

from __future__ import annotations

import asyncio
import random

import pytest

from channels.live_text import LiveText, PrefixScanner, safe_prefix
from channels.telegram.parts import RetirePart, TextPart, plan_parts
from talon.config import Limits
from talon.envelope import OutboundReply
from talon.media import MarkdownMediaRef
from talon.render.telegram import markdown_to_telegram_html
from talon.errors import StreamStopped


@pytest.mark.parametrize("partial, shown", [
    ("Hello **wor", "Hello"),
    ("Hello **world** and", "Hello **world** and"),
    ("code: `x = 1", "code:"),
    ("Intro\n```python\nprint(1)\n", "Intro"),
    ("```python\nprint(1)\n```\nafter", "```python\nprint(1)\n```\nafter"),
    ("see [the docs](http://exa", "see"),
    ("see [the docs](http://example.com) now", "see [the docs](http://example.com) now"),
    ("snake_case_name here", "snake_case_name here"),
    ("* item one\n* item _two", "* item one\n* item"),
    ("2 * 3 = 6", "2 * 3 = 6"),
    ("a \\*literal star", "a \\*literal star"),
    ("[x] brackets and more", "[x] brackets and more"),
    ("~~gone~~ and ~~half", "~~gone~~ and"),
])
def test_safe_prefix_never_ends_inside_markup(partial: str, shown: str) -> None:
    assert safe_prefix(partial) == shown


def test_every_prefix_of_a_marked_up_answer_renders_to_the_same_markup_as_its_final_form() -> None:
    answer = ("Use **bold** and _italic_, `code` and a [link](https://example.com).\n\n"
              "```sh\necho hi\n```\nThen ~~strike~~ and **the end**.")
    for cut in range(len(answer) + 1):
        prefix = safe_prefix(answer[:cut])
        assert answer.startswith(prefix)
        html = markdown_to_telegram_html(prefix)
        # no raw markup marker is ever shown: what is open is cut, what is closed is rendered
        visible = html.replace("<pre>", "").replace("</pre>", "")
        assert "**" not in visible and "~~" not in visible, (cut, prefix, html)


# Pieces that open, close and break markup, line endings Python splits lines at, and plain text.
_PIECES = ["a", "b c", " ", "\n", "\n\n", "`", "```", "~~~", "  ```py\n", "*", "**", "* ", "_", "__", "~~",
           "[", "]", "(", ")", "](", "\\", "x_y", "\r", "\r\n", "\x0c", "\u2028", "é"]


def test_a_growing_answer_is_cut_where_its_whole_text_would_be_cut() -> None:
    """The scanner of a stream keeps what is certain and looks again only at the last line: at
    every length, in pieces of every size, it cuts where a scan of the whole text cuts."""
    rng = random.Random(28)
    for _ in range(500):
        text = "".join(rng.choice(_PIECES) for _ in range(rng.randint(0, 60)))
        scanner, end = PrefixScanner(), 0
        while end < len(text):
            end = min(len(text), end + rng.randint(1, 7))
            assert scanner.prefix(text[:end]) == safe_prefix(text[:end]), repr(text[:end])
    # A text that does not extend the previous one (a preamble replaced) is scanned anew.
    scanner = PrefixScanner()
    assert scanner.prefix("**bold** and `co") == "**bold** and"
    assert scanner.prefix("plain") == "plain"


async def test_live_text_paces_updates_and_a_tool_preamble_is_replaced() -> None:
    shown: list[str] = []

    async def show(text: str) -> bool:
        shown.append(text)
        return True

    live = LiveText(show, interval_s=0.2)
    for word in "Let me look that up ".split(" "):
        await live.on_text(word + " ")
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.25)
    await live.on_step(True)  # that was a preamble to a tool call
    for word in "The answer is forty-two.".split(" "):
        await live.on_text(word + " ")
        await asyncio.sleep(0.15)
    await asyncio.sleep(0.3)
    await live.close()
    assert shown[0].startswith("Let")  # the first update went at once
    assert shown[-1] == "The answer is forty-two."  # the next step's text replaced the preamble
    assert not any("Let me" in s and "answer" in s for s in shown)
    assert len(shown) <= 1 + (0.05 + 0.25 + 0.6 + 0.3) / 0.2 + 1  # about once per interval


async def test_a_long_answer_shows_its_head_only() -> None:
    shown: list[str] = []
    more = asyncio.Event()

    async def show(text: str) -> bool:
        shown.append(text)
        more.set()
        return True

    paragraph = "Some **bold** and `code` here.\n\n"
    live = LiveText(show, interval_s=0, head_chars=1000)
    for count in (20, 40):  # 620 characters, then 1,860: past the head
        await live.on_text(paragraph * count)
        await asyncio.wait_for(more.wait(), 10)
        more.clear()
    await live.close()
    head = safe_prefix((paragraph * 60)[:1000])
    assert 900 < len(head) <= 1000
    assert shown == [safe_prefix(paragraph * 20), head]


async def test_live_text_retries_a_dropped_update_and_stops_for_good_after_stream_stopped() -> None:
    calls: list[str] = []
    answers = iter([False, True, "stop"])

    async def show(text: str) -> bool:
        calls.append(text)
        answer = next(answers)
        if answer == "stop":
            raise StreamStopped("429")
        return bool(answer)

    live = LiveText(show, interval_s=0.05)
    await live.on_text("one ")
    await asyncio.sleep(0.15)  # dropped for want of budget, then tried again without new text
    assert calls == ["one", "one"] and live.shown == "one"
    await live.on_text("two ")
    await asyncio.sleep(0.15)
    assert live.stopped
    await live.on_text("three ")
    await asyncio.sleep(0.15)
    assert calls == ["one", "one", "one two"]  # nothing after StreamStopped
    await live.close()


async def test_close_lets_an_update_in_flight_finish() -> None:
    finished: list[str] = []

    async def slow_show(text: str) -> bool:
        await asyncio.sleep(0.2)
        finished.append(text)  # a first message created on the platform: its id must be known
        return True

    live = LiveText(slow_show, interval_s=0.01)
    await live.on_text("hello ")
    await asyncio.sleep(0.05)
    await live.close()
    assert finished == ["hello"]


def test_a_streamed_answer_edits_its_message_and_a_textless_one_retires_it() -> None:
    limits = Limits()
    chart = MarkdownMediaRef(alt="chart", path="chart.png")
    # normally a short text with one file is its caption...
    assert plan_parts(OutboundReply(text="Here.", media=[chart]), limits)[0].caption == "Here."  # type: ignore[union-attr]
    # ...but a streamed one is the last edit of the message that showed it
    parts = plan_parts(OutboundReply(text="Here.", media=[chart], live_message_id="41"), limits)
    assert parts[0] == TextPart("Here.", edit=41) and parts[1].caption == ""  # type: ignore[union-attr]
    long = "\n\n".join(["word " * 600] * 3)
    parts = plan_parts(OutboundReply(text=long, live_message_id="41"), limits)
    assert len(parts) == 3  # over 4096 units: more messages only for what does not fit
    assert [p.edit for p in parts] == [41, None, None]  # type: ignore[union-attr]
    assert plan_parts(OutboundReply(text="", media=[chart], live_message_id="41"), limits)[0] == RetirePart(41)
