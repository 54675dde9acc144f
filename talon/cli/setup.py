"""``talon setup``: choose channels and a model, check each credential live, write ``.env``, pair
the owner. Interactive, or the same with flags for scripts (``--telegram-token ... --model ... --yes``).

Every credential is checked as it is given, against the base URLs already set in the environment
or the ``.env`` (``TELEGRAM_API_BASE_URL``, ``TWILIO_API_BASE_URL``, ``OPENAI_BASE_URL``...; they
are kept): the bot token with ``getMe`` (the bot's name is shown, Telegram's words when refused),
the Twilio account with its account fetch, the model with one short real request (its answer and
context window are shown). Nothing is written until every check passed or the person chose to
save anyway. Then ``.env`` is written in one atomic replace, mode 0600: an existing file is kept as
``.env.bak`` and only the keys that changed are replaced, in place, everything else (comments,
other keys) untouched. Then the owner is paired: a one-time code is shown and the wizard waits
until it arrives at the bot (``getUpdates``; Talon is not running yet), and puts its sender on
``TALON_TELEGRAM_ALLOWED_USERS``. Ctrl-C before the write leaves everything as it was; during the
pairing wait it leaves the saved settings (complete) and says how to pair later.

The prompts are plain blocking reads with no event loop running (each live check runs a loop of its
own), so Ctrl-C at a prompt is an ordinary KeyboardInterrupt. A second run shows the current choices as defaults: Enter keeps a value, ``-`` clears it.
"""

from __future__ import annotations

import argparse
import os
import re
import secrets
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from talon.permissions import FILE_MODE

# Keys whose values are secrets: never echoed, never printed back.
SECRET_KEYS = {"TELEGRAM_BOT_TOKEN", "TWILIO_AUTH_TOKEN", "OPENAI_API_KEY", "ANTHROPIC_API_KEY"}
_PLAIN = re.compile(r"[A-Za-z0-9_.:/@+,=\-]*")
_CODE_CHARS = "ABCDEFGHJKLMNPQRSTUVWXYZ23456789"  # no 0/O, 1/I
PAIR_TIMEOUT_S = 600.0


# --- the .env file --------------------------------------------------------------------------
def env_value(value: str) -> str:
    if "\n" in value or "\r" in value:
        raise ValueError("a setting cannot hold a line break")
    if _PLAIN.fullmatch(value):
        return value
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def read_env_file(path: Path) -> dict[str, str]:
    if not path.is_file():
        return {}
    from dotenv import dotenv_values

    return {k: v for k, v in dotenv_values(path).items() if v is not None}


def update_env_file(path: Path, changes: dict[str, str]) -> Path | None:
    """Replace only the ``changes`` keys in ``path`` (in place; new ones appended), keeping every
    other line; one atomic replace, mode 0600. An existing file is first kept as ``.env.bak``
    (returned). A crash or Ctrl-C leaves the old file or the new one, never a mix."""
    old = path.read_text("utf-8") if path.is_file() else ""
    lines = old.splitlines()
    done: set[str] = set()
    out: list[str] = []
    for line in lines:
        match = re.match(r"\s*(?:export\s+)?([A-Za-z_][A-Za-z0-9_]*)\s*=", line)
        if match and match.group(1) in changes:
            key = match.group(1)
            if key in done:
                continue  # a key given twice: the first place holds the value now
            out.append(f"{key}={env_value(changes[key])}")
            done.add(key)
        else:
            out.append(line)
    new = [k for k in changes if k not in done]
    if new:
        if out and out[-1].strip():
            out.append("")
        out.append(f"# talon setup, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
        out += [f"{key}={env_value(changes[key])}" for key in new]
    directory = path.parent if str(path.parent) else Path(".")
    backup: Path | None = None
    if path.is_file():
        backup = path.with_name(path.name + ".bak")
        _write_atomic(backup, old)
    _write_atomic(path, "\n".join(out) + "\n", directory)
    return backup


def _write_atomic(path: Path, text: str, directory: Path | None = None) -> None:
    directory = directory or path.parent
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, FILE_MODE)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


# --- prompts --------------------------------------------------------------------------------
@dataclass
class Io:
    """Where the wizard asks and says things (a terminal, or nothing with --yes)."""

    interactive: bool
    ask: Callable[[str], str] = input
    say: Callable[[str], None] = print

    def line(self, prompt: str) -> str:
        return self.ask(prompt).strip()  # end of input (Ctrl-D) stops the wizard like Ctrl-C

    def secret(self, prompt: str) -> str:
        if not sys.stdin.isatty():
            return self.line(prompt)
        import termios

        fd = sys.stdin.fileno()
        before = termios.tcgetattr(fd)
        after = termios.tcgetattr(fd)
        after[3] &= ~termios.ECHO
        termios.tcsetattr(fd, termios.TCSADRAIN, after)
        try:
            return self.line(prompt)
        finally:
            termios.tcsetattr(fd, termios.TCSADRAIN, before)
            self.say("")

    def yes(self, prompt: str, default: bool) -> bool:
        answer = self.line(f"{prompt} [{'Y/n' if default else 'y/N'}] ").lower()
        return default if not answer else answer in ("y", "yes")


def _shown(key: str, value: str) -> str:
    if not value:
        return "not set"
    return "set (hidden)" if key in SECRET_KEYS else value


# --- the live checks --------------------------------------------------------------------------
@dataclass
class Check:
    ok: bool
    text: str


async def check_telegram(token: str, base: str) -> tuple[Check, Any]:
    import asyncio

    from telegram import Bot
    from telegram.error import InvalidToken, NetworkError, TelegramError
    from telegram.request import HTTPXRequest

    base = (base or "https://api.telegram.org").rstrip("/")
    bot = Bot(token, base_url=f"{base}/bot", base_file_url=f"{base}/file/bot",
              request=HTTPXRequest(connect_timeout=10, read_timeout=15))
    try:
        me = await asyncio.wait_for(bot.get_me(), 30)
    except InvalidToken as exc:
        return Check(False, f"Telegram refused the token: {exc.message}. Copy it again from @BotFather "
                            "(/mybots, your bot, API Token)"), None
    except (NetworkError, TimeoutError) as exc:
        detail = exc.message if isinstance(exc, TelegramError) else "no answer in 30 s"
        return Check(False, f"cannot reach the Bot API at {base} ({detail})"), None
    except TelegramError as exc:
        return Check(False, f"getMe at {base} answered: {exc.message}"), None
    finally:
        await bot.shutdown()
    return Check(True, f"the bot is @{me.username} ({me.first_name})"), me


def check_twilio(values: dict[str, str]) -> Check:
    from talon.config import Settings
    from talon.doctor_checks import twilio_account_row

    settings = Settings(_env_file=None, **values)  # type: ignore[call-arg, arg-type]
    row = twilio_account_row(settings)
    if row is None:
        return Check(False, "TWILIO_AUTH_TOKEN is empty")
    text = row[1]
    for prefix in ("ok: ", "FAILED: ", "UNREACHABLE: "):
        text = text.removeprefix(prefix)
    return Check(row[1].startswith("ok"), text)


async def check_model(values: dict[str, str]) -> Check:
    """One short real request; its answer and the model's context window."""
    from talon.agent.providers.base import ModelRequest
    from talon.agent.providers.local import local_model_server
    from talon.agent.providers.profiles import settings_profile
    from talon.config import Settings
    from talon.content import Message
    from talon.errors import ConfigError, LocalModelError
    from talon.runtime import build_provider, model_discoverer
    from talon.storage.attachments import MemoryAttachments

    try:
        settings = Settings(_env_file=None, **values)  # type: ignore[call-arg, arg-type]
        settings.check_model()
    except (ConfigError, ValueError) as exc:
        return Check(False, str(exc))
    local = local_model_server(settings)
    try:
        if local is not None:
            await local.start()
        facts = await model_discoverer(settings, local).discover() if settings.model_discovery else None
        profile = settings_profile(settings, facts=facts if facts is not None and facts.reachable else None)
        with tempfile.TemporaryDirectory() as scratch:
            provider = build_provider(settings, MemoryAttachments(Path(scratch)), local=local)
            try:
                reply = await provider.complete(ModelRequest(system="", messages=[Message.user("Say OK.")],
                                                             max_output_tokens=16))
            finally:
                await provider.aclose()
    except (LocalModelError, ConfigError) as exc:
        return Check(False, str(exc))
    except Exception as exc:  # the provider's own error says what the server said
        return Check(False, f"the model did not answer: {exc}")
    finally:
        if local is not None:
            await local.stop()
    answer = " ".join(reply.message.text.split())[:80] or "(an empty answer)"
    return Check(True, f"{settings.model} answered {answer!r}; context window {profile.context_window:,} tokens")


# --- pairing --------------------------------------------------------------------------------
def new_code() -> str:
    raw = "".join(secrets.choice(_CODE_CHARS) for _ in range(6))
    return f"{raw[:3]}-{raw[3:]}"


def _normal(text: str) -> str:
    return re.sub(r"[^A-Z0-9]", "", text.upper())


async def wait_for_owner(token: str, base: str, code: str, timeout_s: float) -> tuple[int, str] | None:
    """Poll the Bot API until a private message holding ``code`` arrives: (user id, name), after
    telling them they are paired; None when the time ran out. Updates read are confirmed."""
    from telegram import Bot
    from telegram.request import HTTPXRequest

    base = (base or "https://api.telegram.org").rstrip("/")
    bot = Bot(token, base_url=f"{base}/bot", base_file_url=f"{base}/file/bot",
              request=HTTPXRequest(connect_timeout=10, read_timeout=40))
    wanted = _normal(code)
    offset: int | None = None
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            wait = int(max(0, min(10, deadline - time.monotonic())))
            updates = await bot.get_updates(offset=offset, timeout=wait, allowed_updates=["message"])
            for update in updates:
                offset = update.update_id + 1
                message = update.message
                if (message is None or message.from_user is None or message.chat.type != "private"
                        or wanted not in _normal(message.text or "")):
                    continue
                user = message.from_user
                await bot.send_message(message.chat.id, "Paired: you are Talon's owner now. Once `talon run` "
                                                        "is started, write to me here.")
                await bot.get_updates(offset=offset, timeout=0)  # confirmed: `talon run` does not answer it
                name = f"@{user.username}" if user.username else user.first_name
                return user.id, name
        return None
    finally:
        await bot.shutdown()


# --- the wizard -----------------------------------------------------------------------------
@dataclass
class Plan:
    current: dict[str, str]  # the .env file's values, then the environment's
    changes: dict[str, str] = field(default_factory=dict)
    failed: list[str] = field(default_factory=list)

    def value(self, key: str) -> str:
        return self.changes.get(key, self.current.get(key, ""))

    def merged(self) -> dict[str, str]:
        return {**self.current, **self.changes}


_SETTING_KEYS = ("TELEGRAM_BOT_TOKEN", "TELEGRAM_API_BASE_URL", "TWILIO_ACCOUNT_SID", "TWILIO_AUTH_TOKEN",
                 "TWILIO_WHATSAPP_FROM", "TWILIO_API_BASE_URL", "TALON_WHATSAPP_ALLOWED_NUMBERS",
                 "TALON_PUBLIC_BASE_URL", "TALON_MODEL", "OPENAI_API_KEY", "OPENAI_BASE_URL", "ANTHROPIC_API_KEY",
                 "ANTHROPIC_BASE_URL", "TALON_TELEGRAM_ALLOWED_USERS", "TALON_DATA_DIR", "TALON_MEDIA_ROOT",
                 "TALON_MODEL_DISCOVERY", "TALON_MODEL_MAX_RETRIES", "TALON_MODEL_TIMEOUT", "TALON_SPEECH_WARMUP")


def _current(env_file: Path) -> dict[str, str]:
    values = read_env_file(env_file)
    for key in _SETTING_KEYS:
        if os.environ.get(key, "").strip():
            values[key] = os.environ[key]
    return {k: v for k, v in values.items() if k in _SETTING_KEYS or k.startswith(("TALON_", "TELEGRAM_"))}


def _ask_value(io: Io, plan: Plan, key: str, prompt: str, given: str | None) -> str:
    """A flag's value, else the person's answer (Enter keeps the current, ``-`` clears)."""
    if given is not None:
        return given.strip()
    current = plan.value(key)
    if not io.interactive:
        return current
    hint = f" [{_shown(key, current)}; Enter keeps it, - clears it]" if current else ""
    answer = (io.secret if key in SECRET_KEYS else io.line)(f"{prompt}{hint}: ")
    if answer == "-":
        return ""
    return answer or current


def _set(plan: Plan, key: str, value: str) -> None:
    if value != plan.current.get(key, ""):
        plan.changes[key] = value
    else:
        plan.changes.pop(key, None)


def _telegram(io: Io, plan: Plan, args: argparse.Namespace) -> Any:
    import asyncio

    base = plan.value("TELEGRAM_API_BASE_URL")
    while True:
        token = _ask_value(io, plan, "TELEGRAM_BOT_TOKEN", "Telegram bot token (from @BotFather; - for no Telegram)",
                           args.telegram_token)
        if not token:
            _set(plan, "TELEGRAM_BOT_TOKEN", "")
            io.say("telegram: not used")
            return None
        check, me = asyncio.run(check_telegram(token, base))
        io.say(f"telegram: {'ok' if check.ok else 'REFUSED'}: {check.text}")
        if check.ok or not io.interactive or args.telegram_token is not None:
            _set(plan, "TELEGRAM_BOT_TOKEN", token)
            if not check.ok:
                plan.failed.append("telegram")
            return me
        if not io.yes("Try another token?", True):
            _set(plan, "TELEGRAM_BOT_TOKEN", token)
            plan.failed.append("telegram")
            return None


def _whatsapp(io: Io, plan: Plan, args: argparse.Namespace) -> None:
    wanted = args.twilio_account_sid is not None or (
        io.interactive and io.yes("Set up WhatsApp (through a Twilio account)?", bool(plan.value("TWILIO_ACCOUNT_SID"))))
    if not wanted:
        return
    for key, prompt, flag in (("TWILIO_ACCOUNT_SID", "Twilio account SID (AC...)", args.twilio_account_sid),
                              ("TWILIO_AUTH_TOKEN", "Twilio auth token", args.twilio_auth_token),
                              ("TWILIO_WHATSAPP_FROM", "The WhatsApp number Twilio sends from (+1...)",
                               args.whatsapp_from),
                              ("TALON_WHATSAPP_ALLOWED_NUMBERS", "Your own WhatsApp number (the owner)",
                               args.whatsapp_owner)):
        _set(plan, key, _ask_value(io, plan, key, prompt, flag))
    check = check_twilio(plan.merged())
    io.say(f"twilio: {'ok' if check.ok else 'REFUSED'}: {check.text}")
    if not check.ok:
        plan.failed.append("twilio")


def _model(io: Io, plan: Plan, args: argparse.Namespace) -> None:
    import asyncio

    io.say("The model: openai:NAME or anthropic:NAME (hosted; needs an API key), a server URL "
           "(http://host:port/v1, OpenAI-compatible), local:/path/to/model.gguf, or local:bundled (the small "
           "demo model Talon runs itself)")
    spec = _ask_value(io, plan, "TALON_MODEL", "Model", args.model)
    while True:
        if not spec:
            spec = "local:bundled"
        if re.match(r"https?://", spec):
            _set(plan, "OPENAI_BASE_URL", spec)
            name = args.model_name or (io.line("The model's name on that server [default]: ") if io.interactive
                                       else "") or "default"
            spec = f"openai:{name}"
        if args.openai_base_url is not None:
            _set(plan, "OPENAI_BASE_URL", args.openai_base_url)
        _set(plan, "TALON_MODEL", spec)
        provider = spec.split(":", 1)[0] if ":" in spec else "openai"
        if provider == "openai" and not plan.value("OPENAI_BASE_URL"):
            _set(plan, "OPENAI_API_KEY", _ask_value(io, plan, "OPENAI_API_KEY", "OpenAI API key", args.openai_api_key))
        elif provider == "openai" and args.openai_api_key is not None:
            _set(plan, "OPENAI_API_KEY", args.openai_api_key)
        elif provider == "anthropic":
            _set(plan, "ANTHROPIC_API_KEY",
                 _ask_value(io, plan, "ANTHROPIC_API_KEY", "Anthropic API key", args.anthropic_api_key))
        io.say("model: asking it one short question...")
        check = asyncio.run(check_model(plan.merged()))
        io.say(f"model: {'ok' if check.ok else 'FAILED'}: {check.text}")
        if check.ok or not io.interactive or args.model is not None:
            if not check.ok:
                plan.failed.append("model")
            return
        if not io.yes("Try another model?", True):
            plan.failed.append("model")
            return
        spec = _ask_value(io, plan, "TALON_MODEL", "Model", None)


def _run(args: argparse.Namespace, io: Io) -> int:
    import asyncio

    env_file = Path(args.env_file or os.environ.get("TALON_ENV_FILE", "").strip() or ".env")
    plan = Plan(_current(env_file))
    io.say(f"talon setup: writes {env_file.resolve()} (mode 0600; an existing file is kept as "
           f"{env_file.name}.bak). Ctrl-C stops without writing anything.")
    io.say("Channels: Telegram and WhatsApp are asked for below; the console (`talon chat`) needs nothing.")
    me = _telegram(io, plan, args)
    _whatsapp(io, plan, args)
    _model(io, plan, args)
    if not plan.changes:
        io.say("nothing changed: .env is left as it is")
    else:
        io.say("to be saved: " + ", ".join(f"{k}={_shown(k, v)}" for k, v in plan.changes.items()))
        if plan.failed:
            io.say(f"checks failed: {', '.join(plan.failed)}")
            save = args.save_anyway or (io.interactive and io.yes("Save anyway?", False))
        else:
            save = args.yes or not io.interactive or io.yes("Save?", True)
        if not save:
            io.say("not saved: nothing was written" + ("" if args.save_anyway or io.interactive
                                                       else " (--save-anyway saves despite failed checks)"))
            return 1
        backup = update_env_file(env_file, plan.changes)
        io.say(f"saved {env_file}" + (f" (the previous file is {backup})" if backup else ""))
    token = plan.value("TELEGRAM_BOT_TOKEN")
    if me is None or not token or args.no_pair:
        io.say("next: `talon doctor` checks everything, `talon run` starts the bot")
        return 0
    code = new_code()
    io.say(f"pairing: send {code} to @{me.username} on Telegram (waiting up to {args.pair_timeout:.0f} s; "
           "Ctrl-C skips: pair later with `talon pair`)")
    try:
        owner = asyncio.run(wait_for_owner(token, plan.value("TELEGRAM_API_BASE_URL"), code,
                                             args.pair_timeout))
    except Exception as exc:  # a webhook set on the bot (409), the network
        io.say(f"pairing: could not read the bot's messages ({exc}); pair later with `talon pair`")
        return 0
    if owner is None:
        io.say("pairing: the code did not arrive in time; run `talon setup` again, or pair later with `talon pair`")
        return 0
    user_id, name = owner
    allowed = [x.strip() for x in plan.value("TALON_TELEGRAM_ALLOWED_USERS").split(",") if x.strip()]
    if str(user_id) not in allowed:
        allowed.append(str(user_id))
        update_env_file(env_file, {"TALON_TELEGRAM_ALLOWED_USERS": ",".join(allowed)})
    io.say(f"paired: {name} (id {user_id}) is on TALON_TELEGRAM_ALLOWED_USERS. Start the bot with `talon run`.")
    return 0


def cmd_setup(args: argparse.Namespace) -> int:
    interactive = not args.yes and sys.stdin.isatty()
    io = Io(interactive=interactive, say=lambda text: print(text, flush=True))
    try:
        return _run(args, io)
    except (KeyboardInterrupt, EOFError):
        print("\ntalon setup stopped: nothing more was written", file=sys.stderr, flush=True)
        return 130


def add_command(sub: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    setup = sub.add_parser(
        "setup", help="choose channels and a model, check each credential live, write .env, pair the owner",
        description="An interactive wizard (or the same with flags and --yes for scripts): every credential is "
                    "checked live before anything is written; .env is written with mode 0600 (the old one kept as "
                    ".env.bak, only changed keys replaced); then the owner sends a one-time code to the bot and is "
                    "put on the allowlist.")
    setup.add_argument("--telegram-token", metavar="TOKEN", help="the bot token from @BotFather ('' for none)")
    setup.add_argument("--model", metavar="SPEC",
                       help="openai:NAME, anthropic:NAME, a server URL, local:PATH.gguf or local:bundled")
    setup.add_argument("--model-name", metavar="NAME", help="with a server URL as --model: the model's name there")
    setup.add_argument("--openai-api-key", metavar="KEY")
    setup.add_argument("--openai-base-url", metavar="URL")
    setup.add_argument("--anthropic-api-key", metavar="KEY")
    setup.add_argument("--twilio-account-sid", metavar="SID", help="set up WhatsApp through this Twilio account")
    setup.add_argument("--twilio-auth-token", metavar="TOKEN")
    setup.add_argument("--whatsapp-from", metavar="NUMBER", help="the WhatsApp number Twilio sends from")
    setup.add_argument("--whatsapp-owner", metavar="NUMBER", help="your own WhatsApp number (allowed to chat)")
    setup.add_argument("--env-file", metavar="PATH", help="the file to write (default: TALON_ENV_FILE, else ./.env)")
    setup.add_argument("--yes", action="store_true", help="ask nothing: use the flags and current values, save")
    setup.add_argument("--save-anyway", action="store_true", help="save even when a check failed")
    setup.add_argument("--no-pair", action="store_true", help="do not wait for the owner's code")
    setup.add_argument("--pair-timeout", type=float, default=PAIR_TIMEOUT_S, metavar="SECONDS",
                       help=f"how long to wait for the owner's code (default {PAIR_TIMEOUT_S:.0f})")
    setup.set_defaults(func=cmd_setup)

