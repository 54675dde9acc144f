"""Where Talon's settings come from, and which of the settings an error names are really unset.

The ``.env`` rule: ``TALON_ENV_FILE`` (an environment variable; a ``.env`` cannot name another
``.env``) names the file, which must exist; else ``.env`` in the current directory; else
``talon/.env`` in the user's config directory (``$XDG_CONFIG_HOME``, by default ``~/.config``);
else none. Environment variables override what the file says. ``talon run`` logs the source and
``talon doctor`` shows it, so a file that was not read is never a silent surprise.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from talon.config import ENV_FILE_SETTING, Settings
from talon.errors import ConfigError

_NAME = re.compile(r"\b[A-Z][A-Z0-9]*(?:_[A-Z0-9]+)+\b")


@dataclass(frozen=True)
class EnvSource:
    """The ``.env`` file the settings were read from (None: none was found), and why that one."""

    path: Path | None
    reason: str
    looked: tuple[Path, ...] = ()

    def describe(self) -> str:
        if self.path is not None:
            return f"{self.path} ({self.reason}); environment variables override it"
        places = " and ".join(str(p) for p in self.looked)
        return (f"the environment only: no .env file found (looked for {places}; "
                f"{ENV_FILE_SETTING} names another)")


def config_dir(environ: Mapping[str, str] | None = None) -> Path:
    environ = os.environ if environ is None else environ
    base = environ.get("XDG_CONFIG_HOME", "").strip()
    return (Path(base) if base else Path.home() / ".config") / "talon"


def find_env_file(environ: Mapping[str, str] | None = None, cwd: Path | None = None) -> EnvSource:
    """The ``.env`` file to read, by the rule in the module docstring; ConfigError when
    ``TALON_ENV_FILE`` names a file that is not there."""
    environ = os.environ if environ is None else environ
    cwd = Path.cwd() if cwd is None else cwd
    named = environ.get(ENV_FILE_SETTING, "").strip()
    if named:
        path = Path(named).expanduser()
        if not path.is_absolute():
            path = cwd / path
        if not path.is_file():
            raise ConfigError(f"{ENV_FILE_SETTING}={named}: no such file (it names the .env file to read; "
                              "unset it to use ./.env)", [ENV_FILE_SETTING])
        return EnvSource(path.resolve(), ENV_FILE_SETTING)
    here, home = cwd / ".env", config_dir(environ) / ".env"
    if here.is_file():
        return EnvSource(here.resolve(), "the current directory")
    if home.is_file():
        return EnvSource(home.resolve(), "the config directory")
    return EnvSource(None, "", (here, home))


def load_settings(source: EnvSource | None = None) -> tuple[Settings, EnvSource]:
    """Settings from the environment and the ``.env`` file the rule picks."""
    source = source or find_env_file()
    return Settings(_env_file=source.path), source  # type: ignore[call-arg]


def unset(settings: Settings, names: Iterable[str]) -> list[str]:
    """Of the settings an error names, those that have no value: "missing" is said only of these.

    An entry may name several settings ("OPENAI_API_KEY or OPENAI_BASE_URL"): it counts as unset
    when any setting it names is empty. A name Talon does not know is kept (it cannot be checked).
    A setting with a value, its default included (TALON_HTTP_PORT=8080), is not missing even when
    the error is about it: the error's own message says what is wrong with the value."""
    values = _values_by_name(settings)
    out = []
    for entry in names:
        named = _NAME.findall(entry) or [entry]
        if any(name not in values or values[name] in ("", None) for name in named):
            out.append(entry)
    return out


def _values_by_name(settings: Settings) -> dict[str, object]:
    values: dict[str, object] = {}
    for field_name, info in type(settings).model_fields.items():
        alias = info.validation_alias
        choices = getattr(alias, "choices", None)
        if choices:
            for choice in choices:
                if isinstance(choice, str) and choice.isupper():
                    values[choice] = getattr(settings, field_name)
    values[ENV_FILE_SETTING] = os.environ.get(ENV_FILE_SETTING, "")
    return values
