"""The copies and wire forms remembered between requests (talon/agent/context/memo.py) change nothing
that goes over the wire: a conversation with tool calls, images (sent by the person and returned
by a tool, later tombstoned), a refused vision and a summary sends byte for byte the same bodies
with the caches as with them turned off."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from talon.agent.context.memo import DerivedCache
from talon.agent.providers.openai import to_openai_messages
from talon.agent.providers.profiles import ModelProfile
from talon.agent.context.session import is_checkpoint
from talon.storage.sessions import ChatKey
from talon.agent.context.summary import SUMMARY_SYSTEM
from talon.content import AttachmentRef, FileBlock, ImageBlock, Message, TextBlock, ToolCall
from tests.fakes.openai_server import FakeOpenAI, ToolCall as WireToolCall, last_user_text
from tests.support.providers import Setup, openai_provider, png
CHAT = ChatKey("telegram", "31")


# --- the cache itself -------------------------------------------------------------------------
def test_a_value_is_made_once_per_object_and_tag() -> None:
    cache = DerivedCache()
    made: list[tuple[str, str]] = []

    def make(tag: str) -> Any:
        def run(source: Message) -> tuple[str, str]:
            made.append((source.text, tag))
            return (source.text, tag)
        return run

    a, b = Message.user("a"), Message.user("a")  # equal, yet two objects
    first = cache.derive(a, "x", make("x"))
    assert cache.derive(a, "x", make("x")) is first
    assert cache.derive(b, "x", make("x")) == first and made == [("a", "x"), ("a", "x")]
    cache.derive(a, "y", make("y"))
    assert made[-1] == ("a", "y") and len(cache) == 3


def test_the_least_recently_used_go_first_and_keep_nothing_alive_beyond() -> None:
    cache = DerivedCache(max_entries=2)
    calls: list[str] = []

    def make(m: Message) -> str:
        calls.append(m.text)
        return m.text.upper()

    one, two, three = Message.user("one"), Message.user("two"), Message.user("three")
    cache.derive(one, "t", make)
    cache.derive(two, "t", make)
    cache.derive(one, "t", make)  # used again: "two" is now the oldest
    cache.derive(three, "t", make)
    assert len(cache) == 2
    cache.derive(one, "t", make)
    cache.derive(two, "t", make)  # evicted, made again
    assert calls == ["one", "two", "three", "two"]
    off = DerivedCache(max_entries=0)  # a cache that keeps nothing: every call makes afresh
    off.derive(one, "t", make)
    off.derive(one, "t", make)
    assert calls[-2:] == ["one", "one"] and len(off) == 0


# --- the mapper with and without it -----------------------------------------------------------
def _mixed(setup: Setup) -> list[Message]:
    ref = setup.store.blocking.put_bytes(png(), mime="image/png", name="photo.png", width=40, height=30)
    lost = AttachmentRef(id="f" * 64, mime="image/png", bytes=10, name="gone.png")
    doc = AttachmentRef(id="d" * 64, mime="application/pdf", bytes=2000, name="minutes.pdf")
    return [
        Message.user("hello"),
        Message.user("are you there?"),  # a run of user messages, merged on the wire
        Message(role="user", content=[TextBlock(text="what is this?"), ImageBlock(ref=ref),
                                      FileBlock(ref=doc)]),
        Message(role="assistant", content=[TextBlock(text="Let me look.")], tool_calls=[
            ToolCall(id="c1", name="read_file", arguments='{"path": "pic.png"}'),
            ToolCall(id="c2", name="write_file", arguments='{"path": "x.txt", "content": "cut off'),
        ]),
        Message(role="tool", tool_call_id="c1", content=[TextBlock(text="pic.png"), ImageBlock(ref=ref),
                                                         ImageBlock(ref=lost)]),
        Message(role="tool", tool_call_id="c2", content=[], meta={"error": True}),
        Message.assistant(""),
        Message.user("thanks"),
    ]


def test_the_mapper_sends_the_same_with_and_without_remembered_forms(tmp_path: Path) -> None:
    setup = Setup(tmp_path)
    messages = _mixed(setup)
    cache = DerivedCache()
    for vision in (True, False, True):
        plain = to_openai_messages("system", messages, setup.hydrate, vision=vision)
        for _ in range(2):  # the second time every image-less message comes from the cache
            assert to_openai_messages("system", messages, setup.hydrate, vision=vision, copies=cache) == plain
    assert json.dumps(plain).count("data:image/png;base64,") == 2  # images are hydrated every time


# --- whole conversations over the wire --------------------------------------------------------
def _respond(body: dict[str, Any]) -> Any:
    """Plays the model, the same way for both runs: ``[read NAME]`` asks for a file, then answers."""
    messages = body["messages"]
    if messages and messages[0].get("content") == SUMMARY_SYSTEM:
        return "They talked about notes, pictures and tides."
    last = messages[-1]
    text = last_user_text(body)
    if last["role"] == "user" and "[read " in text and "follow in the next message" not in json.dumps(messages[-2:]):
        name = text.split("[read ", 1)[1].split("]", 1)[0]
        return WireToolCall("read_file", {"path": name}, id=f"call_{len(messages)}")
    if last["role"] == "tool" or "Images returned by the tool calls" in text:
        return "I read it."
    return f"noted ({len(messages)} messages so far): {text[:40]}"


async def _conversation(tmp_path: Path, *, cached: bool) -> list[str]:
    setup = Setup(tmp_path)
    (setup.root / "notes.txt").write_text("the tide comes in twice a day\n" * 40)
    photo = await setup.store.put_bytes(png(), mime="image/png", name="photo.png", width=40, height=30)
    async with FakeOpenAI() as fake:
        fake.default_responder = _respond
        provider = openai_provider(fake, setup)
        # A small window, so that older turns are summarized along the way.
        agent = setup.agent(provider, profile=ModelProfile(6_000, 300, True))
        if not cached:
            agent.copies = DerivedCache(max_entries=0)
            provider.copies = DerivedCache(max_entries=0)
        turns = ["hello", "[read notes.txt] please", "[read pic.png] and this one?"]
        turns += [f"question {n} about the tides and the moon, and why the water rises " * 16 for n in range(14)]
        for n, text in enumerate(turns):
            content: list[Any] = [TextBlock(text=text)]
            if n == 3:
                content.append(ImageBlock(ref=photo))
            await agent.run_turn(CHAT, Message(role="user", content=content), f"t{n}")
            if n == 4:
                provider.vision = False  # as after a server refused images: placeholders from now on
        await provider.aclose()
    assert all(r.status == 200 for r in fake.requests)
    assert any(is_checkpoint(m) for m in await setup.sessions.load(CHAT)), "no summary was made"
    # The runs live in different directories, named in the summary's pointer to its archive.
    return [json.dumps(r.json, sort_keys=True).replace(str(tmp_path), "<run>") for r in fake.requests]


async def test_a_conversation_sends_the_same_bodies_with_and_without_the_caches(tmp_path: Path) -> None:
    with_caches = await _conversation(tmp_path / "cached", cached=True)
    without = await _conversation(tmp_path / "plain", cached=False)
    assert len(with_caches) == len(without) > 17
    for n, (a, b) in enumerate(zip(with_caches, without)):
        assert a == b, f"request {n} differs"
    assert any("data:image/png;base64," in body for body in with_caches)
    assert any("was shown earlier and is no longer attached" in body for body in with_caches)
