"""On a fresh machine the suite's workers start PostgreSQL at the same moment, and each, as root,
makes the system user PostgreSQL runs as: concurrent ``useradd`` calls failed (exit 9, the name
taken by the other; exit 10, the group file locked), and every test of the losing workers errored
at setup (seen: 262 errors in one ``make test``)."""

from __future__ import annotations

import os
import pwd
import secrets
import subprocess
import sys
import time

import pytest

RACERS = 8

MAKE_USER = """
import sys, time
from shardbus import embedded
start = float(sys.argv[2])
time.sleep(max(0.0, start - time.time()))
print(embedded._pg_user(sys.argv[1]))
"""


ROUNDS = 4
"""Each round races for a new name: one round of eight racers alone lost the race about half the time."""


def _race_for(name: str) -> list[str]:
    """Start the racers for ``name`` at one instant; return what each printed."""
    start = f"{time.time() + 1.5:.3f}"  # every racer wakes at the same instant
    procs = [subprocess.Popen([sys.executable, "-c", MAKE_USER, name, start],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(RACERS)]
    try:
        results = [proc.communicate(timeout=60) for proc in procs]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
    failures = [err.strip().splitlines()[-1] for (_, err), proc in zip(results, procs, strict=True)
                if proc.returncode != 0]
    assert failures == []
    return [out.strip() for out, _ in results]


@pytest.mark.skipif(os.geteuid() != 0, reason="only root makes a system user (others run PostgreSQL as themselves)")
def test_processes_making_the_postgres_user_at_once_all_get_it() -> None:
    for _ in range(ROUNDS):
        name = f"sbtest_{secrets.token_hex(4)}"
        try:
            assert _race_for(name) == [name] * RACERS
            assert pwd.getpwnam(name).pw_shell == "/usr/sbin/nologin"
        finally:
            subprocess.run(["userdel", name], capture_output=True, timeout=30)
