"""Approval prompts on Discord: a message naming the call with three buttons (message components:
Approve, Deny, Always in this channel), answered through ``INTERACTION_CREATE``.

Each button's ``custom_id`` carries the approval's id in the store, so a press works after a
restart and on any worker (presses are handled in ``on_interaction``, never by a view kept in
memory). The person pressing is checked by the approvals (``talon.control``): only the person who
asked, or an approver, may decide ("always" in a server: a member with Administrator or Manage
Server too); anyone else gets an ephemeral "only the person who asked" and nothing is decided.
The press is acknowledged at once (a deferred update), then the prompt is edited to say what was
decided and by whom, and its buttons go away.

A call longer than a message (2,000 characters) goes first whole as a file, then the prompt with
its beginning; if the file cannot be sent, no buttons are shown and the call is refused
(``ApprovalNotShown``).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import discord

from talon.errors import ApprovalNotShown, DeliveryError
from talon.render.discord import discord_plain

from channels.base import BridgeHandle
from channels.discord.api import CHANNEL, DiscordApi
from channels.discord.delivery import NO_PINGS, Delivery, target

if TYPE_CHECKING:
    from talon.control.approvals import Choice
    from talon.storage.approvals import Approval

log = logging.getLogger(__name__)

PREFIX = "talon:ap:"
CHOICES: dict[str, "Choice"] = {"approve": "approve", "deny": "deny", "always": "always"}
MESSAGE_LIMIT = 2000
HEAD = 1500


def prompt_view(approval_id: str) -> discord.ui.View:
    view = discord.ui.View(timeout=None)
    for choice, label, style in (("approve", "Approve", discord.ButtonStyle.success),
                                 ("deny", "Deny", discord.ButtonStyle.danger),
                                 ("always", "Always in this channel", discord.ButtonStyle.secondary)):
        view.add_item(discord.ui.Button(label=label, style=style, custom_id=f"{PREFIX}{choice}:{approval_id}"[:100]))
    return view


def parse_custom_id(custom_id: str) -> tuple[Choice, str] | None:
    if not custom_id.startswith(PREFIX):
        return None
    choice, _, approval_id = custom_id.removeprefix(PREFIX).partition(":")
    found = CHOICES.get(choice)
    return (found, approval_id) if found is not None and approval_id else None


class ApprovalPrompts:
    def __init__(self, api: DiscordApi, delivery: Delivery) -> None:
        self.api = api
        self.delivery = delivery
        self._bridge: BridgeHandle | None = None

    def bind(self, bridge: BridgeHandle) -> None:
        self._bridge = bridge

    async def ask_approval(self, approval: Approval, text: str) -> str | None:
        where = target(approval.platform_chat, approval.thread_id)
        shown = discord_plain(text)
        if len(shown) > MESSAGE_LIMIT:
            try:
                await self.delivery.upload(where, text.encode(), f"approval-{approval.id}.txt")
            except DeliveryError as exc:
                raise ApprovalNotShown(f"the call is too long for a Discord message and its file could not be "
                                       f"sent ({exc})") from exc
            shown = f"{shown[:HEAD]}\n… ({len(text)} characters in all: the whole call is in the file above)"
        view = prompt_view(approval.id)
        channel = self.api.messageable(where)
        sent = await self.api.call(where, "approval prompt", lambda: channel.send(
            shown, view=view, allowed_mentions=NO_PINGS))
        view.stop()  # presses are handled in on_interaction, from any worker
        return str(sent.id)

    async def settle_approval(self, approval: Approval, text: str) -> None:
        where = target(approval.platform_chat, approval.thread_id)
        if approval.prompt_id is None:
            await self.delivery.notice(where, text)
            return
        message = self.api.messageable(where).get_partial_message(int(approval.prompt_id))
        await self.api.call(where, "settle approval", lambda: message.edit(
            content=discord_plain(text)[:MESSAGE_LIMIT], view=None, allowed_mentions=NO_PINGS))

    async def on_interaction(self, interaction: discord.Interaction[Any]) -> None:
        if interaction.type is not discord.InteractionType.component or self._bridge is None:
            return
        data: Any = interaction.data or {}
        parsed = parse_custom_id(str(data.get("custom_id", "")))
        control = self._bridge.control
        if parsed is None or control is None:
            return
        choice, approval_id = parsed
        user = interaction.user
        perms = user.guild_permissions if isinstance(user, discord.Member) else None
        admin = perms is not None and (perms.administrator or perms.manage_guild)
        answer = await control.approvals.answer(approval_id, choice, CHANNEL, str(user.id), user.display_name,
                                                user.name, admin=admin)
        try:
            if answer.outcome == "decided" and answer.approval is not None:
                await interaction.response.defer()
                await control.approvals.settle(self, answer.approval)
            else:
                await interaction.response.send_message(answer.note or "Nothing to decide.", ephemeral=True)
        except discord.HTTPException as exc:  # the decision holds; only its display failed
            log.warning("discord: answering the press on approval %s failed: %s", approval_id, exc)
