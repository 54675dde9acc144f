"""No test module imports another: a helper two test files share lives in tests/support/ (or
tests/fakes/, tests/conftest.py), so that running, moving or deleting one test file never changes
what another one sees, and pytest never collects a module's tests twice under another name."""

from __future__ import annotations

import re
from pathlib import Path

TESTS = Path(__file__).parent
# from tests.test_x import ..., from tests import test_x, import tests.test_x, from .test_x import ...
_IMPORTS_A_TEST = re.compile(
    r"^[ \t]*(?:from[ \t]+(?:tests\.test_\w*|\.+test_\w*)[ \t]+import\b"
    r"|from[ \t]+(?:tests|\.)[ \t]+import[ \t]+\(?[ \t]*test_"
    r"|import[ \t]+tests\.test_)", re.M)


def test_imports_of_test_modules_are_found() -> None:
    for line in ("from tests.test_whatsapp import post", "    from tests.test_x import y  # noqa",
                 "import tests.test_cli_process", "from tests import test_foundation_e2e",
                 "from .test_agent_providers import Setup"):
        assert _IMPORTS_A_TEST.search(line), line
    for line in ("from tests.support.whatsapp import post", "from tests.conftest import ALICE",
                 "from tests.fakes.telegram import FakeTelegram", "# from tests.test_x import y",
                 'text = "see tests/test_whatsapp.py"'):
        assert not _IMPORTS_A_TEST.search(line), line


def test_no_test_module_imports_another() -> None:
    offenders = []
    for path in sorted(TESTS.rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        offenders += [f"{path.relative_to(TESTS.parent)}:{text.count(chr(10), 0, m.start()) + 1}: {m.group(0).strip()}"
                      for m in _IMPORTS_A_TEST.finditer(text)]
    assert not offenders, ("a test module imports another; move the shared helper to tests/support/:\n"
                           + "\n".join(offenders))
