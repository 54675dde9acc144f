"""The provider contract: one neutral request in, one neutral assistant message out.

Each provider adapter is a pure mapper to and from its wire format plus a thin client call.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass, field
from typing import Any

from talon.content import Message


@dataclass(frozen=True)
class ToolSpec:
    name: str
    description: str
    parameters: dict[str, Any]


@dataclass
class ModelRequest:
    system: str
    messages: list[Message]
    tools: list[ToolSpec] = field(default_factory=list)
    max_output_tokens: int | None = None
    # Where the stable part of the system prompt ends (for prompt-caching breakpoints).
    system_cache_points: list[int] = field(default_factory=list)


@dataclass(frozen=True)
class Usage:
    input_tokens: int
    output_tokens: int


@dataclass
class ModelResponse:
    message: Message
    usage: Usage | None = None
    finish_reason: str | None = None


class Provider(abc.ABC):
    """An LLM behind one ``complete`` call. Raises ``talon.errors.ProviderError`` subclasses."""

    name: str
    model: str

    @abc.abstractmethod
    async def complete(self, request: ModelRequest) -> ModelResponse: ...

    async def aclose(self) -> None:  # noqa: B027 - optional hook
        """Release network resources."""
