"""Acknowledgement: the bot reacts to a message when its turn takes it up, and takes the reaction
away once the reply has been delivered (``TALON_TELEGRAM_ACK_REACTION``, 👀 by default; empty for
none). A message that joins a running turn (steer) is acknowledged when it joins.

Both are cosmetic calls of the chat's send budget, and setting the reaction pays for its clearing
too (two calls of the cosmetic share at once, or none: the reaction is then left out). So the
clearing never waits for room, and never takes any from an answer; a reaction left behind would
say the bot is still at work, so it waits out a 429 (up to ``CLEAR_WAIT_MAX_S``). Failures of
either are logged by the bridge and never touch the turn.
"""

from __future__ import annotations

import asyncio
import logging

from telegram.constants import ReactionEmoji

from talon.bounded import BoundedMap
from talon.envelope import InboundMessage
from talon.errors import ConfigError

from channels.telegram.api import TelegramApi

log = logging.getLogger(__name__)

# Longest a cleared reaction waits for a chat that a 429 blocked; beyond it the reaction stays.
CLEAR_WAIT_MAX_S = 10.0
ALLOWED_REACTIONS = frozenset(e.value for e in ReactionEmoji)


def check_reaction(emoji: str) -> str:
    """The configured reaction, or ConfigError when Telegram would refuse it for a bot."""
    emoji = emoji.strip()
    if emoji and emoji not in ALLOWED_REACTIONS:
        raise ConfigError(f"TALON_TELEGRAM_ACK_REACTION={emoji!r} is not a reaction Telegram lets bots set "
                          "(use one of its standard reaction emoji, e.g. \N{EYES} or \N{THUMBS UP SIGN}, "
                          "or leave it empty for none)", ["TALON_TELEGRAM_ACK_REACTION"])
    return emoji


class Reactions:
    """The acknowledgement reaction (see the module docstring); ``emoji`` "" for none."""

    def __init__(self, api: TelegramApi, emoji: str) -> None:
        self.api = api
        self.ack_reaction = check_reaction(emoji)
        # Keys of the messages that carry it now; bounded, and forgotten after an hour (a turn
        # lasts at most TALON_TURN_TIMEOUT), so a message never cleared cannot keep its key.
        self._acknowledged: BoundedMap[str, bool] = BoundedMap("telegram_reactions")

    async def acknowledge(self, message: InboundMessage) -> None:
        if not self.ack_reaction or not message.message_id.isdigit() or message.key in self._acknowledged:
            return
        if not self.api.budget.try_spend(message.chat_id, calls=2):  # the set, and the clear later
            log.debug("telegram: chat=%s: no budget for the acknowledgement of %s", message.chat_id,
                      message.message_id)
            return
        await self.api.bot.set_message_reaction(chat_id=int(message.chat_id), message_id=int(message.message_id),
                                            reaction=self.ack_reaction)
        self._acknowledged[message.key] = True

    async def unacknowledge(self, message: InboundMessage) -> None:
        if message.key not in self._acknowledged:
            return
        self._acknowledged.pop(message.key, None)
        blocked = self.api.budget.blocked_for(message.chat_id)
        if blocked > CLEAR_WAIT_MAX_S:
            log.info("telegram: chat=%s: the reaction on %s stays: Telegram asked to wait %.0fs", message.chat_id,
                     message.message_id, blocked)
            return
        if blocked:
            await asyncio.sleep(blocked)
        await self.api.bot.set_message_reaction(chat_id=int(message.chat_id), message_id=int(message.message_id),
                                            reaction=[])
