"""Tools the deploy checks run: promtool (``make promtool``; missing, the tests fail) and a
compose command; and the ``needs_engine`` marker of the test that brings compose up for real."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PROMETHEUS_DIR = ROOT / "deploy" / "prometheus"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "needs_engine: brings compose up on a container engine (docker or podman) with the images it names "
        "(make test-compose; make test leaves it out); where there is none, or its images cannot be had, "
        "the test is skipped with the exact error, or fails with SHARDBUS_REQUIRE_COMPOSE=1")


@pytest.fixture(scope="session")
def promtool() -> str:
    """promtool's path. Missing, the test fails (a skipped check would pass unseen)."""
    found = shutil.which("promtool") or ("/usr/bin/promtool" if Path("/usr/bin/promtool").exists() else None)
    if found is None:
        pytest.fail("promtool not found: run `make promtool` (Debian's prometheus package)")
    return found


def run_promtool(promtool: str, *args: str, cwd: Path = PROMETHEUS_DIR) -> subprocess.CompletedProcess[str]:
    return subprocess.run([promtool, *args], cwd=cwd, capture_output=True, text=True, timeout=120)
