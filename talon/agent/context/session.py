"""What the agent keeps in a session log besides the conversation: summary checkpoints and the
records that close a refused turn. The store itself is ``talon.storage.sessions``."""

from __future__ import annotations

from collections.abc import Sequence

from talon.content import Message

CHECKPOINT_KEY = "checkpoint"
SUMMARY_CHECKPOINT = "summary"


# Meta key of the record that closes a turn the model server refused for good: the turn stays in
# the log, but later requests leave it out (``talon.agent.context.pipeline.conversation_view``).
FAILED_TURN = "failed_turn"


def failed_turns(history: Sequence[Message]) -> set[str]:
    return {str(m.meta.get("turn_id")) for m in history if m.meta.get(FAILED_TURN)}


def is_checkpoint(message: Message) -> bool:
    """A summary checkpoint record (bookkeeping in the log, not a turn of the conversation)."""
    return message.meta.get(CHECKPOINT_KEY) == SUMMARY_CHECKPOINT
