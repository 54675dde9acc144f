"""A reply delivered again after a restart arrives once on Discord: each message of a reply is
sent with a nonce made from the reply's delivery key and the part's place (Discord enforces it:
the same nonce again returns the first message and creates none; the fake does the same)."""

from __future__ import annotations

from pathlib import Path

from talon.envelope import OutboundReply
from tests.fakes.discord import FakeDiscord
from tests.fakes.openai_server import FakeOpenAI
from tests.support.discord import DM, discord_fake, discord_settings, running  # noqa: F401  (a fixture)

LONG = "\n\n".join(f"Paragraph {n}: " + "words " * 300 for n in range(3))  # three messages


async def test_a_reply_delivered_twice_with_its_key_arrives_once_and_another_reply_arrives_too(
    discord_fake: FakeDiscord, llm: FakeOpenAI, tmp_path: Path  # noqa: F811
) -> None:
    async with running(discord_settings(tmp_path, discord_fake, llm)) as runtime:
        [channel] = runtime.channels
        reply = OutboundReply(text=LONG, notices=["A note after the text."], delivery_key="discord:503:77#0")
        await channel.deliver(str(DM), reply)
        first = discord_fake.texts(DM)
        assert len(first) == 4 and first[-1] == "A note after the text."
        await channel.deliver(str(DM), reply)  # as after a SIGKILL between the send and its record
        assert discord_fake.texts(DM) == first
        await channel.deliver(str(DM), OutboundReply(text="Paragraph 0: again", delivery_key="discord:503:78#0"))
        await channel.deliver(str(DM), OutboundReply(text="no key, no nonce"))
        await channel.deliver(str(DM), OutboundReply(text="no key, no nonce"))
    assert discord_fake.texts(DM) == [*first, "Paragraph 0: again", "no key, no nonce", "no key, no nonce"]
