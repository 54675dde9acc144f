"""The unit tier's check (tests/support/tiers.py), run on small suites of its own in a pytester:
a unit test that burns 0.5 s of CPU fails it, naming the rule; a 0.01 s one passes; a slow or e2e
test may take as long as it likes; a unit test that waits past the wall-time guard fails too; and
a test that sleeps while using no CPU is not charged for the time the machine gave to others."""

from __future__ import annotations

import pytest

pytest_plugins = ["pytester"]

pytestmark = pytest.mark.slow  # each runs a pytest session of its own and burns CPU on purpose

CONFTEST = """
import pytest
from tests.support.tiers import pytest_runtest_call, pytest_runtest_makereport, pytest_runtest_setup  # noqa: F401
from tests.support import tiers

tiers.WARM_IMPORTS = ()  # the small suites import nothing heavy


def pytest_collection_modifyitems(items):
    for item in items:
        if item.get_closest_marker("slow") is None:
            item.add_marker(pytest.mark.unit)
"""

TESTS = """
import time
import pytest


def burn(seconds):
    start = time.process_time()
    while time.process_time() - start < seconds:
        pass


def test_burns_half_a_second():
    burn(0.5)


def test_takes_a_hundredth():
    burn(0.01)


@pytest.fixture
def costly_setup():
    burn(0.2)


def test_setup_and_call_add_up(costly_setup):
    burn(0.2)


@pytest.mark.slow
def test_slow_may_burn():
    burn(0.5)


def test_failing_on_its_own():
    burn(0.5)
    assert False, "its own failure"
"""


INI = "[pytest]\nasyncio_default_fixture_loop_scope = function\n"


def test_a_unit_test_over_the_cpu_bound_fails_the_tier_check(pytester: pytest.Pytester) -> None:
    pytester.makeini(INI)
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_tiers=TESTS)
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider", "-p", "no:xdist", "-rA")
    result.assert_outcomes(passed=2, failed=3)
    out = result.stdout.str()
    assert "PASSED test_tiers.py::test_takes_a_hundredth" in out
    assert "PASSED test_tiers.py::test_slow_may_burn" in out
    result.stdout.fnmatch_lines([
        "*unit tier check: test_tiers.py::test_burns_half_a_second took 0.5* s of CPU (setup and call), over the "
        "unit tier's 0.3 s*slow or e2e tier*",
    ])
    # setup (0.2 s) and call (0.2 s) are one cost
    result.stdout.fnmatch_lines(["*unit tier check: test_tiers.py::test_setup_and_call_add_up took 0.4* s of CPU*"])
    # a test failing for its own reason keeps that reason
    assert "its own failure" in out and "test_failing_on_its_own took" not in out


WAITS = """
import time


def test_waits_past_the_guard():
    time.sleep(3.2)


def test_short_sleep_costs_no_cpu():
    time.sleep(0.4)
"""


def test_a_unit_test_that_waits_long_fails_and_a_short_wait_is_not_cpu(pytester: pytest.Pytester) -> None:
    pytester.makeini(INI)
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_waits=WAITS)
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider", "-p", "no:xdist", "-rA")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["*unit tier check: test_waits.py::test_waits_past_the_guard took 3.* s*"
                                 "wall-time guard for tests that wait*"])
    assert "PASSED test_waits.py::test_short_sleep_costs_no_cpu" in result.stdout.str()
