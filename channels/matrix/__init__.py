"""Matrix channel on matrix-nio: ``/sync`` in, the client-server API out.

One module per job, each a class given what it needs; ``MatrixChannel`` (``channel.py``) builds
one ``MatrixApi`` and hands it to every part (composition, as ``channels/telegram/``):

| module | job |
|---|---|
| ``channel.py`` | log in, start, stop, health; the live views (``channels/edited_view.py``) |
| ``api.py`` | ``MatrixApi``: how a call is made: the room's budget, ``M_LIMIT_EXCEEDED``, retries |
| ``sync.py`` | the ``/sync`` loop and its saved token (nothing lost on a crash) |
| ``intake.py`` | events in: direct messages, rooms, mentions, threads, files, edits |
| ``downloads.py`` | ``mxc://`` files fetched during the turn, capped |
| ``delivery.py`` | replies out: HTML text, edits, files, notices |
| ``reactions.py`` | the acknowledgement reaction |
| ``approvals.py`` | approval prompts answered by a reaction (or a yes/no reply) |

Shared with the other channels: ``channels/reply_parts.py``, ``channels/edited_view.py``,
``channels/rooms.py``, ``channels/admission.py``, ``channels/outbound_files.py``,
``channels/send_budget.py``, ``channels/live_text.py``; rendering in ``talon/render/matrix.py``.
"""

from channels.matrix.channel import MatrixChannel

__all__ = ["MatrixChannel"]
