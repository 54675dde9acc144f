"""Slack channel on slack-sdk: the Events API (or Socket Mode) in, the Web API out.

One module per job, each a class given what it needs; ``SlackChannel`` (``channel.py``) builds
one ``SlackApi`` and hands it to every part (composition, as ``channels/telegram/``):

| module | job |
|---|---|
| ``channel.py`` | sign in (``auth.test``), start, stop, health; live views; the ack reaction |
| ``api.py`` | ``SlackApi``: how a call is made: the channel's budget, 429 ``Retry-After``, retries |
| ``events.py`` | the two doors: Events API over HTTP (signed, 5-minute window) and Socket Mode |
| ``intake.py`` | events in: direct messages, channels, mentions, threads, files, slash commands |
| ``downloads.py`` | ``url_private`` files fetched with the bot token, from Slack's host only |
| ``delivery.py`` | replies out: mrkdwn text, edits, files (upload v2), notices |
| ``approvals.py`` | approval prompts with Block Kit buttons |

Shared with the other channels: ``channels/reply_parts.py``, ``channels/edited_view.py``,
``channels/rooms.py``, ``channels/admission.py``, ``channels/outbound_files.py``,
``channels/send_budget.py``, ``channels/live_text.py``; rendering in ``talon/render/slack.py``.
"""

from channels.slack.channel import SlackChannel

__all__ = ["SlackChannel"]
