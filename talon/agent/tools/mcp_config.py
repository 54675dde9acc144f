"""The MCP servers file (``TALON_MCP_CONFIG``): the ``mcpServers`` JSON other clients use.

```json
{"mcpServers": {
  "time": {"command": "mcp-server-time", "args": ["--local-timezone", "Europe/Berlin"]},
  "git":  {"command": "mcp-server-git", "args": ["--repository", "${WORKSPACE}"],
           "denyTools": ["git_commit", "git_reset"]},
  "docs": {"url": "https://mcp.example.com/mcp", "headers": {"Authorization": "Bearer ..."}}
}}
```

A server has either ``command`` (stdio: ``args``, ``env``, ``cwd``) or ``url`` (streamable HTTP:
``headers``). ``allowTools`` / ``denyTools`` narrow its tools (names or ``*`` patterns);
``disabled: true`` leaves it out. ``${WORKSPACE}`` in ``args``, ``env`` or ``cwd`` makes a stdio
server per conversation: each chat that uses it gets its own process, in the shell's sandbox with
its workspace at ``/workspace`` (``for_workspace(Path("/workspace"))``; see ``talon.agent.tools.mcp_launch``).
Every mistake is a ``ConfigError`` naming the server and the key, so Talon refuses to start
rather than run with half a configuration.
"""

from __future__ import annotations

import fnmatch
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from talon.errors import ConfigError

__all__ = ["WORKSPACE_VAR", "McpServerConfig", "load_mcp_config", "parse_mcp_config"]

WORKSPACE_VAR = "${WORKSPACE}"
_SETTING = "TALON_MCP_CONFIG"
_KNOWN = {"command", "args", "env", "cwd", "url", "headers", "type", "transport", "allowTools",
          "denyTools", "disabled", "description"}
# Keys other clients write that mean nothing here; accepted so a file can be shared as is.
_IGNORED = {"autoApprove", "alwaysAllow", "timeout", "envFile", "oauth", "name"}


@dataclass(frozen=True)
class McpServerConfig:
    name: str
    command: str | None = None
    args: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    cwd: str | None = None
    url: str | None = None
    headers: dict[str, str] = field(default_factory=dict)
    allow_tools: tuple[str, ...] | None = None
    deny_tools: tuple[str, ...] = ()

    @property
    def transport(self) -> str:
        return "stdio" if self.command is not None else "http"

    @property
    def per_chat(self) -> bool:
        """True when the server takes a conversation's workspace (``${WORKSPACE}`` appears)."""
        values = [*self.args, *self.env.values(), self.cwd or ""]
        return any(WORKSPACE_VAR in value for value in values)

    def wants(self, tool: str) -> bool:
        """Whether the server's tool ``tool`` is offered (``allowTools`` / ``denyTools``)."""
        if self.allow_tools is not None and not any(fnmatch.fnmatchcase(tool, p) for p in self.allow_tools):
            return False
        return not any(fnmatch.fnmatchcase(tool, p) for p in self.deny_tools)

    def for_workspace(self, workspace: Path | None) -> "McpServerConfig":
        """This server with ``${WORKSPACE}`` replaced by ``workspace`` (an absolute directory)."""
        if not self.per_chat:
            return self
        if workspace is None:
            raise ConfigError(f"MCP server {self.name!r} uses {WORKSPACE_VAR} but no workspace was given")
        where = str(workspace)
        return McpServerConfig(
            name=self.name,
            command=self.command,
            args=tuple(a.replace(WORKSPACE_VAR, where) for a in self.args),
            env={k: v.replace(WORKSPACE_VAR, where) for k, v in self.env.items()},
            cwd=(self.cwd or where).replace(WORKSPACE_VAR, where),
            url=self.url,
            headers=dict(self.headers),
            allow_tools=self.allow_tools,
            deny_tools=self.deny_tools,
        )


def load_mcp_config(path: Path, *, explicit: bool) -> list[McpServerConfig]:
    """The servers declared in ``path``. A missing file is no servers unless it was named
    explicitly (``TALON_MCP_CONFIG``), which makes it an error."""
    if not path.exists():
        if explicit:
            raise ConfigError(f"{_SETTING}={path}: the file does not exist", [_SETTING])
        return []
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{_SETTING}={path}: cannot be read ({exc})", [_SETTING]) from exc
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{_SETTING}={path}: not valid JSON: {exc.msg} at line {exc.lineno}, "
                          f"column {exc.colno}", [_SETTING]) from exc
    return parse_mcp_config(data, source=str(path))


def parse_mcp_config(data: Any, *, source: str = "the MCP config") -> list[McpServerConfig]:
    if not isinstance(data, dict) or not isinstance(data.get("mcpServers"), dict):
        raise ConfigError(f'{source}: expected an object with "mcpServers": {{"name": {{...}}}}', [_SETTING])
    servers: list[McpServerConfig] = []
    for name, entry in data["mcpServers"].items():
        server = _server(name, entry, source)
        if server is not None:
            servers.append(server)
    return servers


_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")


def _server(name: str, entry: Any, source: str) -> McpServerConfig | None:
    where = f"{source}: server {name!r}"
    if not _NAME.fullmatch(name):
        raise ConfigError(f"{where}: a server name is 1-64 letters, digits, '_', '-' or '.', starting with a "
                          "letter or digit (it becomes part of the tool names)", [_SETTING])
    if not isinstance(entry, dict):
        raise ConfigError(f"{where}: expected an object with \"command\" or \"url\"", [_SETTING])
    unknown = sorted(set(entry) - _KNOWN - _IGNORED)
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {', '.join(unknown)} (known: {', '.join(sorted(_KNOWN))})",
                          [_SETTING])
    if entry.get("disabled") is True:
        return None
    kind = entry.get("type", entry.get("transport"))
    if kind is not None and kind not in ("stdio", "http", "streamable-http", "streamableHttp"):
        raise ConfigError(f"{where}: transport {kind!r} is not supported (use \"stdio\" with a command, or "
                          "streamable HTTP with a url; the older SSE transport is not)", [_SETTING])
    command, url = entry.get("command"), entry.get("url")
    if (command is None) == (url is None):
        raise ConfigError(f"{where}: give either \"command\" (a program Talon starts) or \"url\" "
                          "(a streamable-HTTP server), not both or neither", [_SETTING])
    allow = _names(entry, "allowTools", where)
    deny = _names(entry, "denyTools", where) or ()
    if url is not None:
        if not isinstance(url, str) or not re.match(r"https?://[^/\s]+", url):
            raise ConfigError(f"{where}: \"url\" must be an http:// or https:// URL", [_SETTING])
        for key in ("command", "args", "env", "cwd"):
            if key in entry:
                raise ConfigError(f"{where}: \"{key}\" is for stdio servers, not with \"url\"", [_SETTING])
        if WORKSPACE_VAR in url:
            raise ConfigError(f"{where}: {WORKSPACE_VAR} works only for stdio servers Talon starts", [_SETTING])
        return McpServerConfig(name=name, url=url, headers=_strings(entry, "headers", where),
                               allow_tools=allow, deny_tools=deny)
    if not isinstance(command, str) or not command.strip():
        raise ConfigError(f"{where}: \"command\" must be a non-empty string", [_SETTING])
    if "headers" in entry:
        raise ConfigError(f"{where}: \"headers\" is for servers with a \"url\"", [_SETTING])
    args = entry.get("args", [])
    if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
        raise ConfigError(f"{where}: \"args\" must be a list of strings", [_SETTING])
    cwd = entry.get("cwd")
    if cwd is not None and not isinstance(cwd, str):
        raise ConfigError(f"{where}: \"cwd\" must be a string", [_SETTING])
    if WORKSPACE_VAR in command:
        raise ConfigError(f"{where}: {WORKSPACE_VAR} may appear in args, env or cwd, not in the command",
                          [_SETTING])
    return McpServerConfig(name=name, command=command, args=tuple(args), env=_strings(entry, "env", where),
                           cwd=cwd, allow_tools=allow, deny_tools=deny)


def _strings(entry: dict[str, Any], key: str, where: str) -> dict[str, str]:
    value = entry.get(key, {})
    if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        raise ConfigError(f"{where}: \"{key}\" must be an object of strings", [_SETTING])
    return dict(value)


def _names(entry: dict[str, Any], key: str, where: str) -> tuple[str, ...] | None:
    value = entry.get(key)
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise ConfigError(f"{where}: \"{key}\" must be a list of tool names (or * patterns)", [_SETTING])
    return tuple(value)
