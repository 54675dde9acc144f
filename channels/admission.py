"""Who may speak in a direct conversation, asked the same way on every channel: the access gate
(``TALON_<CHANNEL>_ALLOWED_USERS`` and pairing approvals); deny by default. An unknown sender
gets a pairing code when ``TALON_PAIRING`` is on (at most one every ten minutes, by the gate's
rule), otherwise silence; the log says how to let them in either way. Rooms and channels are not
asked here: a room is served when it is listed (``TALON_<CHANNEL>_ALLOWED_ROOMS``/``_CHANNELS``),
and pairing codes are never posted in a room."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence

from talon.ports import SenderGate

log = logging.getLogger(__name__)


async def admit_direct(gate: SenderGate, channel: str, identities: Sequence[str], *, name: str,
                       allow_setting: str, tell: Callable[[str], Awaitable[None]]) -> bool:
    """True when the sender (``identities[0]`` is their id) may talk to the agent; otherwise the
    pairing code, if any, is sent with ``tell`` and False returned."""
    sender = identities[0]
    if await gate.allowed(channel, identities):
        return True
    pairing = await gate.request_pairing(channel, sender, name)
    if pairing is None:
        log.warning("%s: message from %s denied; to allow them add %s to %s", channel, sender, sender,
                    allow_setting)
        return False
    log.warning("%s: message from %s denied; to allow them run `talon pair %s` (or add %s to %s)", channel,
                sender, pairing.code, sender, allow_setting)
    if pairing.reply is not None:
        try:
            await tell(pairing.reply)
        except Exception as exc:  # the code is in the log too; the owner can still pair them
            log.warning("%s: could not send the pairing code to %s: %s", channel, sender, exc)
    return False
