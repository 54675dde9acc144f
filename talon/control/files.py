"""``TALON_APPROVAL=send``: the files a reply attaches wait for a yes, like a tool call."""

from __future__ import annotations

import dataclasses
import json

from talon.agent.hooks import ApproveCall
from talon.content import ToolCall
from talon.control.approvals import SEND_FILES_TOOL
from talon.envelope import OutboundReply


async def hold_files(reply: OutboundReply, approve: ApproveCall) -> OutboundReply:
    """One approval for all of a reply's files, keyed like a call of the turn (so a restart finds
    it again); refused, the text goes without them and says which were not sent."""
    paths = [ref.path for ref in reply.media]
    refusal = await approve(ToolCall(id="reply-files", name=SEND_FILES_TOOL,
                                     arguments=json.dumps({"files": paths}, ensure_ascii=False)))
    if refusal is None:
        return reply
    why = "denied by the user" if "denied" in refusal else "no approval in time"
    note = f"{len(paths)} file(s) not sent ({why}): {', '.join(paths)}"
    return dataclasses.replace(reply, media=[], notices=[*reply.notices, note])
