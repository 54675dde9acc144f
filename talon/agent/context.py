"""The context pipeline: transforms of what the model will see, applied per request.

Each step takes the messages about to be sent and returns new ones; the session log itself is
never edited by a step. Steps are small and individually testable.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

from talon.content import Message

ContextStep = Callable[[list[Message]], Awaitable[list[Message]]]


@dataclass
class ContextPipeline:
    steps: Sequence[ContextStep] = field(default_factory=list)

    async def apply(self, messages: list[Message]) -> list[Message]:
        for step in self.steps:
            messages = await step(messages)
        return messages
