"""The Discord channel's pieces on their own: Discord markdown, which attachment addresses are
fetched, button ids, how Discord's errors are read, the settings."""

from __future__ import annotations

from typing import Any

import pytest

from channels.discord import DiscordChannel
from channels.discord.api import classify, media_hosts
from channels.discord.approvals import parse_custom_id, prompt_view
from channels.discord.intake import command_text
from talon.config import Settings
from talon.errors import ConfigError, PlatformRateLimited
from talon.render.discord import DISCORD_TEXT_LIMIT, discord_plain, markdown_to_discord, split_for_discord


def settings(**extra: Any) -> Settings:
    values: dict[str, Any] = {"DISCORD_BOT_TOKEN": "t", **extra}
    return Settings(_env_file=None, **values)  # type: ignore[arg-type]


def test_discord_markdown_keeps_the_dialect_and_escapes_stray_markers() -> None:
    out = markdown_to_discord("# Plan\n**bold** _it_ ~~gone~~ `a*b` [docs](https://a.example/x)\n- item\n3*4 ||x||")
    assert out == "# Plan\n**bold** *it* ~~gone~~ `a*b` [docs](<https://a.example/x>)\n- item\n3\\*4 \\|\\|x\\|\\|"
    assert markdown_to_discord("[x](javascript:alert(1))") == "x (javascript:alert(1))"  # never a link
    assert markdown_to_discord("```py\nprint('```')\n```").count("```") == 2  # a fence inside stays inside
    assert markdown_to_discord("- not a list? no, a list") == "- not a list? no, a list"
    assert discord_plain("**bold** *x*") == "bold x"


def test_long_answers_are_cut_under_2000_characters_once_rendered() -> None:
    pieces = split_for_discord("word_with_underscores * " * 120)
    assert len(pieces) > 1 and all(len(markdown_to_discord(p)) <= DISCORD_TEXT_LIMIT for p in pieces)


def test_attachments_come_only_from_discords_hosts() -> None:
    from channels.discord.downloads import fetchable

    class Api:
        base_url = "https://discord.com/api/v10"
        media_hosts = media_hosts(base_url)

    api: Any = Api()
    assert fetchable("https://cdn.discordapp.com/attachments/1/2/a.png?ex=1", api)
    assert fetchable("https://media.discordapp.net/attachments/1/2/a.png", api)
    for url in ("http://cdn.discordapp.com/attachments/1/2/a.png", "https://cdn.discordapp.com.evil.example/a",
                "https://cdn.discordapp.com@evil.example/a", "https://169.254.169.254/latest/meta-data",
                "file:///etc/passwd", "https://evil.example/cdn.discordapp.com/a"):
        assert not fetchable(url, api), url
    assert media_hosts("http://127.0.0.1:9/api/v10") == frozenset({"127.0.0.1:9"})


def test_button_ids_name_the_choice_and_the_approval_and_nothing_else_parses() -> None:
    view = prompt_view("ap-123")
    ids = [item.custom_id for item in view.children]  # type: ignore[attr-defined]
    view.stop()
    assert ids == ["talon:ap:approve:ap-123", "talon:ap:deny:ap-123", "talon:ap:always:ap-123"]
    assert parse_custom_id(ids[0]) == ("approve", "ap-123")
    for hostile in ("talon:ap:sudo:ap-123", "talon:ap:approve:", "other:approve:1", ""):
        assert parse_custom_id(hostile) is None


def test_a_long_429_names_its_wait_and_refusals_are_permanent() -> None:
    import discord

    limited = classify(discord.RateLimited(45.0), "send")
    assert isinstance(limited, PlatformRateLimited) and limited.seconds == 45.0

    class Response:
        status = 403
        reason = "Forbidden"

    forbidden = classify(discord.Forbidden(Response(), {"code": 50013, "message": "Missing Permissions"}), "send")  # type: ignore[arg-type]
    assert forbidden.permanent and "50013" in str(forbidden)


def test_commands_and_settings() -> None:
    assert command_text("!stop") == "/stop" and command_text("/new") == "/new" and command_text("!rm x") == "!rm x"
    assert settings(TALON_DISCORD_ALLOWED_CHANNELS="1, 2").discord_allowed_channel_ids == {"1", "2"}
    with pytest.raises(ConfigError) as bad:
        settings(TALON_DISCORD_ALLOWED_CHANNELS="#general").discord_allowed_channel_ids  # noqa: B018
    assert "Copy Channel ID" in str(bad.value)
    with pytest.raises(ConfigError):
        DiscordChannel(settings(DISCORD_BOT_TOKEN=""))
