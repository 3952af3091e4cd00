"""The cost markers of tests/conftest.py can be wrong, and then a test fails: here a small
suite of its own, run in-process with tests/conftest.py's hooks, gets its markers from what
its tests call (not from what their text names), and the guard fails the test whose marker
its run does not bear out."""

from __future__ import annotations

import pytest

pytest_plugins = ("pytester",)

CONFTEST = """
from tests.conftest import (_cost_marker_guard, nats_url, pytest_collection_modifyitems,  # noqa: F401
                            pytest_runtest_makereport, servers_dir)
"""

SUITE = '''
import subprocess
import sys


def test_names_a_process_in_words_only():
    """Runs sys.executable? No: it only says ``subprocess.run([sys.executable])`` and ``start_nats(``."""
    assert "sys.executable"


def test_calls_a_process_it_never_starts():
    if sys.maxsize < 0:
        subprocess.run([sys.executable, "-V"], check=True, timeout=30)


def test_asks_for_a_server(nats_url):
    pass
'''


INI = """
[pytest]
asyncio_default_fixture_loop_scope = function
markers =
    unit
    integration
    system
    faults
"""


def _markers(pytester: pytest.Pytester) -> dict[str, str]:
    items, _ = pytester.inline_genitems()
    return {item.name: next(m.name for m in item.iter_markers() if m.name in {"unit", "integration", "system"})
            for item in items}


def test_a_marker_comes_from_calls_and_fixtures_and_the_guard_fails_one_not_borne_out(pytester):
    pytester.makeini(INI)
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_suite=SUITE)
    assert _markers(pytester) == {"test_names_a_process_in_words_only": "unit",
                                  "test_calls_a_process_it_never_starts": "system",
                                  "test_asks_for_a_server": "integration"}
    result = pytester.inline_run("-p", "no:cacheprovider", "-k", "not server")
    result.assertoutcome(passed=2, failed=1)  # the second's call passed; its tear-down failed
    [failed] = result.getfailures()
    assert failed.nodeid.endswith("test_calls_a_process_it_never_starts")
    assert "marked system for what its code calls, but started no process of ours" in str(failed.longrepr)
