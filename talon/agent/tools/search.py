"""The agent's ``search_conversations`` tool: full-text search over THIS chat's stored history.

The chat is never an argument: it is the conversation whose turn is running (``TURN_MESSAGE``, set
by the bridge), so no query, limit or wording can reach another chat's messages. The store
matches the query's plain words only (``talon.storage.search``). Hits say when and who.
"""

from __future__ import annotations

from typing import Any

from talon.agent.tools.registry import Tool, ToolResult
from talon.envelope import TURN_MESSAGE
from talon.errors import ToolError
from talon.storage.search import MAX_LIMIT, SEARCH_OFF, clamp_limit, format_hits
from talon.storage.sessions import ChatKey, SessionStore


class SearchConversationsTool(Tool):
    name = "search_conversations"
    description = (
        "Search this chat's earlier messages (all past conversations in this chat, also those no longer "
        "in your context) for words; answers newest first with the date and who said it. Use it when "
        "the person refers to something said before that you do not see.")
    parameters = {
        "type": "object",
        "properties": {
            "query": {"type": "string", "description": "Words to find (all must occur), e.g. 'boiler pressure'."},
            "limit": {"type": "integer", "minimum": 1, "maximum": MAX_LIMIT,
                      "description": "Most messages to return (default 10)."},
        },
        "required": ["query"],
    }

    def __init__(self, sessions: SessionStore) -> None:
        self.sessions = sessions

    async def run(self, args: dict[str, Any]) -> ToolResult:
        message = TURN_MESSAGE.get()
        if message is None:
            raise ToolError("search_conversations works only in a chat, while answering a person")
        query = args.get("query")
        if not isinstance(query, str) or not query.strip():
            raise ToolError("query must be a non-empty string of words")
        limit = args.get("limit")
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int)):
            raise ToolError(f"limit must be a whole number from 1 to {MAX_LIMIT}")
        if not self.sessions.search_enabled:
            return ToolResult.text(SEARCH_OFF)
        chat = ChatKey(message.channel, message.conversation_id)
        hits = await self.sessions.search(chat, query, clamp_limit(limit))
        return ToolResult.text(format_hits(query, hits))
