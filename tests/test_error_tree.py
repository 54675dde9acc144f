"""The one error tree: every exception class Talon defines lives in talon/errors.py, descends from
TalonError and is drawn in that module's docstring under its parent; errors.py imports nothing
from the layers above it."""

from __future__ import annotations

import ast
import importlib
import inspect
from pathlib import Path

import talon.errors as errors

ROOT = Path(__file__).resolve().parent.parent
BRANCH = " │├└─"


def module_names() -> list[str]:
    """Every module under talon/ and channels/, read from the files (a folder without an
    ``__init__`` would be skipped by ``pkgutil.walk_packages``; the files never are)."""
    names = []
    for package in ("talon", "channels"):
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            names.append(".".join(parts))
    return names


def defined_exceptions(module: object) -> list[type[BaseException]]:
    """Exception classes a module defines itself: at its top level, or nested in its classes."""
    found: list[type[BaseException]] = []
    for value in vars(module).values():
        if not inspect.isclass(value) or value.__module__ != module.__name__:  # type: ignore[attr-defined]
            continue
        if issubclass(value, BaseException):
            found.append(value)
        found += [inner for inner in vars(value).values()
                  if inspect.isclass(inner) and issubclass(inner, BaseException)]
    return found


def exception_class_statements(path: Path) -> list[str]:
    """Classes defined anywhere in a file (functions included) whose bases read like exceptions."""
    hits = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ClassDef):
            bases = [ast.unparse(base) for base in node.bases]
            if any(b.split(".")[-1].endswith(("Error", "Exception")) for b in bases):
                hits.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name}({', '.join(bases)})")
    return hits


def drawing() -> dict[str, int]:
    """The docstring's tree: each class name drawn, with the column its name starts at."""
    drawn: dict[str, int] = {}
    for line in (errors.__doc__ or "").splitlines():
        stripped = line.lstrip(BRANCH)
        name = stripped.split(" ")[0] if stripped else ""
        if name.isidentifier() and name[0].isupper() and (line.startswith("    TalonError") or "── " in line):
            assert name not in drawn, f"{name} is drawn twice"
            drawn[name] = len(line) - len(stripped)
    return drawn


def tree_classes() -> list[type[BaseException]]:
    return [value for value in vars(errors).values()
            if inspect.isclass(value) and issubclass(value, BaseException) and value.__module__ == errors.__name__]


def test_the_walk_sees_every_layer() -> None:
    names = module_names()
    for expected in ("talon.agent.providers.retries", "talon.storage.postgres.db", "talon.speech.transcribe",
                     "channels.telegram.webhook", "channels.whatsapp", "talon.errors"):
        assert expected in names


def test_no_exception_class_is_defined_outside_talon_errors() -> None:
    elsewhere = []
    for name in module_names():
        if name == errors.__name__:
            continue
        module = importlib.import_module(name)
        elsewhere += [f"{name}.{cls.__qualname__}" for cls in defined_exceptions(module)]
    assert elsewhere == [], f"exception classes defined outside talon/errors.py: {elsewhere}"


def test_no_exception_class_statement_outside_talon_errors() -> None:
    """The import walk sees module and class attributes; this reads the source, so a class made
    inside a function (never an attribute of anything) is found too."""
    found = []
    for package in ("talon", "channels"):
        for path in sorted((ROOT / package).rglob("*.py")):
            if path != Path(errors.__file__).resolve():
                found += exception_class_statements(path)
    assert found == []


def test_every_class_descends_from_talon_error_and_is_drawn_under_its_parent() -> None:
    classes = tree_classes()
    assert len(classes) > 40
    drawn = drawing()
    for cls in classes:
        assert issubclass(cls, errors.TalonError), cls
        assert cls.__name__ in drawn, f"{cls.__name__} is not drawn in talon/errors.py's docstring"
        if cls is errors.TalonError:
            continue
        parent = next(b for b in cls.__mro__[1:] if b.__module__ == errors.__name__)
        assert drawn[cls.__name__] == drawn[parent.__name__] + 4, f"{cls.__name__} is not drawn under {parent.__name__}"
    # and nothing is drawn that is not a class here
    assert set(drawn) == {cls.__name__ for cls in classes}


def test_the_drawing_shows_the_stdlib_bases_code_catches() -> None:
    doc = errors.__doc__ or ""
    for cls in tree_classes():
        extra = [b.__name__ for b in cls.__bases__ if b.__module__ == "builtins" and b is not Exception]
        for base in extra:
            assert f"{cls.__name__} ({base})" in doc, f"{cls.__name__} is also a {base}: draw it so"


def test_one_name_per_meaning() -> None:
    # the model refusing an image and an image Talon cannot use are two meanings, two names
    assert issubclass(errors.ImageRejected, errors.ProviderError)
    assert issubclass(errors.ImageUnusable, errors.MediaError)
    assert not issubclass(errors.ImageUnusable, errors.ProviderError)
    # both platforms' bad webhook bodies are one meaning, one class
    from channels.telegram.update_shape import parse_update
    from channels.whatsapp import parse_inbound

    for parse in (lambda: parse_update(b"not json"), lambda: parse_inbound({})):
        try:
            parse()
        except Exception as exc:  # noqa: BLE001 - the type is what is checked
            assert type(exc) is errors.MalformedWebhook, exc
        else:
            raise AssertionError("a malformed body was accepted")


def test_errors_imports_nothing_from_talon_or_channels() -> None:
    tree = ast.parse(Path(errors.__file__).read_text())
    imported = [node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)]
    imported += [alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names]
    assert [m for m in imported if m.split(".")[0] in ("talon", "channels")] == []
    assert all(node.level == 0 for node in ast.walk(tree) if isinstance(node, ast.ImportFrom))
