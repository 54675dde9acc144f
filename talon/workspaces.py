"""Which directory is whose workspace: the one mapping from a conversation to its folder.

Under ``TALON_WORKSPACE=chat`` (the default) every conversation gets its own directory under the
media root, ``<root>/<channel>/<conversation>``; its inbound files, the files its agent writes and
its ``AGENTS.md`` live there, and its tools, outbound references and media links are contained in
it. ``TALON_WORKSPACE=shared`` makes the media root itself the one workspace of every chat: only
for a single owner, since every chat then sees every other chat's files and memory.

Both components are encoded injectively (two different ids never share a folder): letters,
digits, ``-`` and ``_`` stay, every other byte of the UTF-8 form becomes ``%XX``. A ``%`` is
itself encoded, so the mapping can be undone, and ``.``, ``/`` and ``:`` never appear, so no name
is ``.``/``..`` or a path. Names longer than a file system allows are cut and completed with a
hash of the whole id, which keeps them distinct.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Literal

from talon.errors import ConfigError

__all__ = ["WorkspaceMode", "chat_workspace", "check_dirs_apart", "encode_part", "workspace_root"]

WorkspaceMode = Literal["chat", "shared"]

_KEEP = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_")
_MAX_NAME = 200  # well below the 255 bytes of ext4, btrfs, xfs


def encode_part(value: str) -> str:
    """One path component from an outside id; different ids give different names."""
    if not value:
        return "%"  # no id encodes to a lone '%', so the empty id keeps a name of its own
    out = "".join(
        ch if ch in _KEEP else "".join(f"%{b:02X}" for b in ch.encode("utf-8", "surrogatepass"))
        for ch in value
    )
    if len(out) > _MAX_NAME:
        digest = hashlib.sha256(value.encode("utf-8", "surrogatepass")).hexdigest()[:32]
        # '~' never appears in an encoded name, so a cut name cannot equal an uncut one.
        out = f"{out[: _MAX_NAME - 34]}~{digest}"
    return out


def chat_workspace(root: Path, channel: str, conversation_id: str) -> Path:
    """The workspace directory of one conversation under the media ``root`` (not created)."""
    return Path(root) / encode_part(channel) / encode_part(conversation_id)


def workspace_root(root: Path, mode: WorkspaceMode, channel: str, conversation_id: str) -> Path:
    """The directory a conversation's agent works in, under the given mode."""
    if mode == "shared":
        return Path(root)
    return chat_workspace(root, channel, conversation_id)


def check_dirs_apart(media_root: Path, data_dir: Path) -> None:
    """Refuse a data dir inside the media root, or the reverse: the agent would reach sessions,
    the inbox and approvals with its file tools (or write into Talon's state)."""
    media = Path(os.path.realpath(media_root))
    data = Path(os.path.realpath(data_dir))
    if media == data or data.is_relative_to(media):
        raise ConfigError(
            f"TALON_DATA_DIR ({data}) is inside TALON_MEDIA_ROOT ({media}): the agent's file tools "
            "could read and change sessions and approvals. Put them in separate directories.",
            ["TALON_DATA_DIR", "TALON_MEDIA_ROOT"],
        )
    if media.is_relative_to(data):
        raise ConfigError(
            f"TALON_MEDIA_ROOT ({media}) is inside TALON_DATA_DIR ({data}): the agent would work "
            "among Talon's own state. Put them in separate directories.",
            ["TALON_DATA_DIR", "TALON_MEDIA_ROOT"],
        )
