"""The seam between the core and the channels stays typed (talon/ports.py, docs/architecture.md):
the core asks channels typed questions (no hasattr), nothing reads a private attribute of another
object, ``Bridge`` is what a channel's handle says it is, no ``Any`` crosses the seam, and the
Telegram channel is composed of parts rather than mixins."""

from __future__ import annotations

import abc
import ast
import dataclasses
import inspect
import typing
from pathlib import Path

from talon.bridge import Bridge
from talon.control.approvals import Answer, Approvals, Choice, Prompter
from talon.media.received import ReceivedNote
from talon.ports import ApprovalAnswers, BridgeHandle, Channel, SenderGate
from talon.storage.access import AccessGate, Pairing
from talon.storage.approvals import Approval
from talon.storage.leases import Leases

from channels.telegram import TelegramChannel

ROOT = Path(__file__).resolve().parent.parent
# The core's side of the seam, and the composition root that wires channels to it.
CORE_FILES = ["talon/runtime.py", "talon/health.py", "talon/doctor_checks.py", "talon/bridge.py",
              "talon/ports.py", *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "talon/cli").glob("*.py"))]
# Names that talon/ports.py imports only for type checking, for get_type_hints.
HINT_NAMES = {"Answer": Answer, "Choice": Choice, "Prompter": Prompter, "ReceivedNote": ReceivedNote,
              "Pairing": Pairing, "Approval": Approval, "Leases": Leases}


def _sources() -> list[Path]:
    return [ROOT / name for name in CORE_FILES] + sorted((ROOT / "channels").rglob("*.py"))


def _calls_to(path: Path, function: str) -> list[int]:
    tree = ast.parse(path.read_text(), str(path))
    return [node.lineno for node in ast.walk(tree)
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == function]


def test_the_core_asks_channels_typed_questions() -> None:
    found = {f"{name}:{line}" for name in ("talon/runtime.py", "talon/health.py", "talon/doctor_checks.py")
             for line in _calls_to(ROOT / name, "hasattr")}
    assert not found, f"hasattr in the core (give the Channel ABC the question instead): {sorted(found)}"


def test_the_ast_walk_sees_hasattr(tmp_path: Path) -> None:
    probe = tmp_path / "probe.py"
    probe.write_text("def f(channel):\n    return hasattr(channel, 'poll_leader')\n")
    assert _calls_to(probe, "hasattr") == [2]


def _private_reads(path: Path) -> list[str]:
    """Attributes named ``_x`` read on anything but ``self``, ``cls`` or ``super()``."""
    reads = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if not (isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__")):
            continue
        owner = node.value
        if isinstance(owner, ast.Name) and owner.id in ("self", "cls"):
            continue
        if isinstance(owner, ast.Call) and isinstance(owner.func, ast.Name) and owner.func.id == "super":
            continue
        if isinstance(owner, ast.Name) and owner.id == "os" and node.attr == "_exit":
            continue
        reads.append(f"{path.relative_to(ROOT)}:{node.lineno}: {ast.unparse(node)}")
    return reads


def test_no_private_attribute_is_read_from_outside() -> None:
    reads = [read for path in _sources() for read in _private_reads(path)]
    assert not reads, "private attributes read from outside their object:\n" + "\n".join(reads)
    assert not [line for path in _sources() for line in _calls_to(path, "hasattr")]


def _members(protocol: type) -> set[str]:
    return {name for name in vars(protocol) if not name.startswith("_")}


def _satisfies(cls: type, protocol: type) -> list[str]:
    """What ``cls`` lacks of ``protocol``: a member, a coroutine method, or a parameter name."""
    fields = {f.name for f in dataclasses.fields(cls)} if dataclasses.is_dataclass(cls) else set()
    problems = []
    for name in sorted(_members(protocol)):
        wanted = vars(protocol)[name]
        if isinstance(wanted, property):
            if name not in fields and not hasattr(cls, name):
                problems.append(f"{name}: missing")
            continue
        have = getattr(cls, name, None)
        if have is None:
            problems.append(f"{name}: missing")
            continue
        if inspect.iscoroutinefunction(wanted) != inspect.iscoroutinefunction(have):
            problems.append(f"{name}: async in one and not the other")
        if list(inspect.signature(wanted).parameters) != list(inspect.signature(have).parameters):
            problems.append(f"{name}: parameters {inspect.signature(have)} != {inspect.signature(wanted)}")
    return problems


def test_a_bridge_is_what_the_channels_handle_says() -> None:
    # mypy checks the same in talon/bridge.py (_a_bridge_is_a_handle); this says it at test time.
    assert _members(BridgeHandle) == {"gate", "control", "metrics", "submit", "idle"}
    assert _satisfies(Bridge, BridgeHandle) == []
    assert _satisfies(AccessGate, SenderGate) == []
    assert _satisfies(Approvals, ApprovalAnswers) == []

    class NotABridge:
        async def submit(self, message: object, extra: int) -> bool:
            return True

    problems = _satisfies(NotABridge, BridgeHandle)
    assert problems[:4] == ["control: missing", "gate: missing", "idle: missing", "metrics: missing"]
    assert len(problems) == 5 and problems[4].startswith("submit: parameters")


def _mentions_any(hint: object) -> bool:
    if hint is typing.Any:
        return True
    if isinstance(hint, (list, tuple)):  # a Callable's parameters
        return any(_mentions_any(arg) for arg in hint)
    return any(_mentions_any(arg) for arg in typing.get_args(hint))


def _hints(function: object) -> dict[str, object]:
    import talon.ports

    return typing.get_type_hints(function, globalns=vars(talon.ports), localns=HINT_NAMES)


def test_no_any_crosses_the_seam() -> None:
    checked = []
    for owner in (Channel, BridgeHandle, SenderGate, ApprovalAnswers):
        for name, member in vars(owner).items():
            if name.startswith("_"):
                continue
            function = member.fget if isinstance(member, property) else member
            if not callable(function):
                continue
            hints = _hints(function)
            assert hints, f"{owner.__name__}.{name} has no annotations"
            leaky = {param: hint for param, hint in hints.items() if _mentions_any(hint)}
            assert not leaky, f"Any in {owner.__name__}.{name}: {leaky}"
            checked.append(f"{owner.__name__}.{name}")
    assert {"Channel.start", "Channel.deliver", "Channel.live_reply", "Channel.health", "Channel.ask_approval",
            "Channel.typing", "Channel.share_updates", "BridgeHandle.submit"} <= set(checked)
    assert _mentions_any(typing.Callable[[typing.Any], None])  # the walk finds Any nested in a hint


def test_channels_take_the_handle_not_the_bridge() -> None:
    from channels.console import ConsoleChannel
    from channels.whatsapp import WhatsAppChannel

    for channel in (Channel, TelegramChannel, ConsoleChannel, WhatsAppChannel):
        assert _hints(channel.start)["bridge"] is BridgeHandle, channel.__name__
    for path in (ROOT / "channels").rglob("*.py"):
        assert "talon.bridge" not in path.read_text(), f"{path} imports the bridge itself"


def _imports_of(path: Path) -> set[str]:
    modules = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module:
            modules.add(node.module)
        elif isinstance(node, ast.Import):
            modules.update(alias.name for alias in node.names)
    return modules


def test_the_core_owns_the_seam() -> None:
    assert not {m for m in _imports_of(ROOT / "talon/ports.py") if m.split(".")[0] == "channels"}
    assert Channel.__module__ == "talon.ports" and BridgeHandle.__module__ == "talon.ports"


def test_the_telegram_channel_is_composed_not_mixed_in() -> None:
    """Between the channel and ``Channel`` there are only the forwarders of channels/base.py: no
    constructor, no state, only methods that ask a part the channel holds (``self.delivery``...),
    so no part can reach another's state through a shared base."""
    between = TelegramChannel.__mro__[1:TelegramChannel.__mro__.index(Channel)]
    assert TelegramChannel.__mro__[-3:] == (Channel, abc.ABC, object)
    for base in between:
        assert base.__module__ == "channels.base", base
        own = {k: v for k, v in vars(base).items() if not k.startswith("__") and k != "_abc_impl"}
        assert all(inspect.isfunction(v) for v in own.values()), (base, own)
        assert "__init__" not in vars(base), base
