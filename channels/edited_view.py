"""A live answer shown as one message edited in place, for platforms that edit (Matrix, Slack,
Discord); what to show and when is ``channels/live_text.py``'s.

The first update posts a message (into the thread, as a reply where the platform threads
replies) and its id goes at once to the bridge's ``placed`` callback (recorded in the inbox, so
that after a crash the final reply edits it rather than posting a second copy); later updates
edit it. Updates are cosmetic calls of the chat's send budget: dropped when it is short. A
channel's ``post``/``edit`` raise ``StreamStopped`` on a rate limit or a refusal (penalizing the
budget first), which ends the view for the turn; the final reply is delivered as usual and its
first part edits the message (``channels/reply_parts.py``). Media references are taken out of
what is shown, and an update never exceeds one message (``first_piece``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from talon.bounded import BoundedMap
from talon.envelope import InboundMessage, LiveReply, conversation_id
from talon.media import extract_markdown_media

from channels.live_text import HEAD_CHARS, LiveText
from channels.send_budget import SendBudget

Post = Callable[[InboundMessage, str], Awaitable[str]]  # markdown -> the new message's id
Edit = Callable[[InboundMessage, str, str], Awaitable[None]]  # (message, id, markdown)
FirstPiece = Callable[[str], str]  # the part of the markdown that fits one message


class EditedView:
    """One turn's live view: a message posted once, then edited."""

    def __init__(self, views: EditedViews, message: InboundMessage, *,
                 placed: Callable[[str], Awaitable[None]] | None, resume_id: str | None) -> None:
        self.views = views
        self.message = message
        self.message_id = resume_id
        self._placed = placed
        self.text = LiveText(self.show, interval_s=views.interval_s, head_chars=views.head_chars)

    @property
    def showing(self) -> bool:
        return self.text.shown is not None

    async def show(self, markdown: str) -> bool:
        body, _ = extract_markdown_media(markdown)
        piece = self.views.first_piece(body)
        if not piece.strip():
            return True  # nothing a person could read yet
        if not self.views.budget.try_spend(self.message.chat_id):
            return False
        if self.message_id is None:
            self.message_id = await self.views.post(self.message, piece)
            if self._placed is not None:
                await self._placed(self.message_id)  # in the inbox before anything else happens
        else:
            await self.views.edit(self.message, self.message_id, piece)
        return True

    async def close(self) -> None:
        await self.text.close()
        self.views.closed(self)


def _writing(view: EditedView) -> bool:
    return not view.text.stopped


class EditedViews:
    """The live view of each conversation whose answer is being written."""

    def __init__(self, name: str, budget: SendBudget, *, post: Post, edit: Edit, first_piece: FirstPiece,
                 interval_s: float, head_chars: int = HEAD_CHARS, enabled: bool = True) -> None:
        self.budget = budget
        self.post = post
        self.edit = edit
        self.first_piece = first_piece
        self.interval_s = interval_s
        self.head_chars = head_chars
        self.enabled = enabled
        self._views: BoundedMap[str, EditedView] = BoundedMap(f"{name}_live_views", in_use=_writing)

    def live_reply(self, message: InboundMessage, *, placed: Callable[[str], Awaitable[None]] | None = None,
                   resume_id: str | None = None) -> LiveReply | None:
        if not self.enabled:
            return None
        view = EditedView(self, message, placed=placed, resume_id=resume_id)
        self._views[message.conversation_id] = view
        return LiveReply(on_text=view.text.on_text, on_step=view.text.on_step, close=view.close)

    def closed(self, view: EditedView) -> None:
        if self._views.get(view.message.conversation_id) is view:
            self._views.pop(view.message.conversation_id, None)

    def showing(self, chat_id: str, thread_id: str | None = None) -> bool:
        view = self._views.get(conversation_id(chat_id, thread_id))
        return view is not None and view.showing and not view.text.stopped
