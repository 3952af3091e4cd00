"""The env file ``shardbus up`` leaves in its state directory (``.shardbus/env``, mode 0600):
the addresses and tokens it printed, as ``KEY=value`` lines, so that a second terminal finds
the stack.

Every other ``shardbus`` command run in the project directory reads it (``cli.main``): a
variable set in the environment wins over it, and it is read only while the ``shardbus up``
that wrote it is running (it holds ``up.lock``), since a stopped stack's addresses lead
nowhere. ``shardbus status`` says where its NATS address came from and refuses to report
when the file's stack is not running (``shardbus/status.py``).

The file is also a shell env file: ``set -a; . .shardbus/env; set +a``.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import MutableMapping
from dataclasses import dataclass, field
from pathlib import Path

DEFAULT_STATE_DIR = ".shardbus"
"""``shardbus up``'s state directory, relative to the directory it is run in."""

STATE_DIR_VARIABLE = "SHARDBUS_STATE_DIR"
"""Names another state directory, for ``shardbus up`` and for the commands that look for its env file."""

ENV_FILE = "env"
"""The env file's name inside the state directory."""

LOCK_FILE = "up.lock"
"""What a running ``shardbus up`` holds locked (its pid inside)."""

SETTINGS = {
    "NATS_URL": "SHARDBUS_NATS_URL",
    "DATABASE_URL": "SHARDBUS_DATABASE_URL",
    "SHARD_TOKEN": "SHARDBUS_SHARD_TOKEN",
    "WEB_TOKEN": "SHARDBUS_WEB_TOKEN",
    "WEB_OPERATOR_TOKEN": "SHARDBUS_WEB_OPERATOR_TOKEN",
}
"""Which line of the env file gives which setting to the commands (``SHARD_ADDR`` is the
default ``--addr`` of ``shardbus shard-sim``)."""


def state_dir(cwd: Path | None = None) -> Path:
    """Where ``shardbus up`` keeps its state: ``$SHARDBUS_STATE_DIR``, else ``./.shardbus``."""
    named = os.environ.get(STATE_DIR_VARIABLE, "").strip()
    return Path(named) if named else (cwd or Path.cwd()) / DEFAULT_STATE_DIR


def write(directory: Path, lines: dict[str, str], pid: int) -> Path:
    """Write ``lines`` to ``directory/env``, readable by its owner only (it holds tokens), and
    atomically: a command reading it meanwhile sees the old file or the new one."""
    path = directory / ENV_FILE
    tmp = directory / f".{ENV_FILE}.{pid}.tmp"
    text = (f"# Written by `shardbus up` (pid {pid}) running on {directory}: the lines it printed.\n"
            "# Every `shardbus` command run in this project reads it while that stack runs; a variable\n"
            "# set in the environment wins (SHARDBUS_NATS_URL over NATS_URL, …). Holds secrets: mode 0600.\n"
            + "".join(f"{key}={value}\n" for key, value in lines.items()))
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchmod(fd, 0o600)
        os.write(fd, text.encode())
    finally:
        os.close(fd)
    os.replace(tmp, path)
    return path


def parse(text: str) -> dict[str, str]:
    """``KEY=value`` lines (comments and blank lines skipped)."""
    values: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.strip().partition("=")
        if sep and key and not key.startswith("#"):
            values[key.strip()] = value.strip()
    return values


def holder(directory: Path) -> int | None:
    """The pid of the ``shardbus up`` running on ``directory``, or None when none is.

    A running ``up`` holds an exclusive lock on ``up.lock``; a shared lock we can take means
    nobody holds it (we release it at once; ``up`` retries its own lock briefly for that)."""
    try:
        lock = open(directory / LOCK_FILE)  # noqa: SIM115 — closed by the with below; only open's OSError means no lock
    except OSError:
        return None
    with lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            text = lock.read().strip()
            return int(text) if text.isdigit() else -1
        fcntl.flock(lock, fcntl.LOCK_UN)
        return None


@dataclass
class StackEnv:
    """An env file found for this directory, and what it gave the environment."""

    path: Path
    values: dict[str, str]
    pid: int | None
    """The running ``shardbus up``'s pid; None when it is not running."""
    applied: set[str] = field(default_factory=set)
    """The settings (``SHARDBUS_…``) taken from the file: those the environment did not set."""

    @property
    def running(self) -> bool:
        return self.pid is not None

    def describe(self) -> str:
        """``/x/.shardbus/env, written by the shardbus up running there (pid 123)``, for messages."""
        if not self.running:
            return f"{self.path}, whose shardbus up is not running"
        pid = f" (pid {self.pid})" if self.pid and self.pid > 0 else ""
        return f"{self.path}, written by the shardbus up running there{pid}"


def find(cwd: Path | None = None) -> StackEnv | None:
    """The env file of the state directory for ``cwd`` (see :func:`state_dir`), if there is one."""
    directory = state_dir(cwd)
    path = directory / ENV_FILE
    try:
        text = path.read_text()
    except OSError:
        return None
    return StackEnv(path.resolve(), parse(text), holder(directory))


def apply(stack: StackEnv, environ: MutableMapping[str, str] | None = None) -> set[str]:
    """Give the environment the settings the file holds and the environment does not: an
    explicitly set variable wins. Returns (and records) the settings taken from the file."""
    env: MutableMapping[str, str] = os.environ if environ is None else environ
    for key, setting in SETTINGS.items():
        if key in stack.values and not env.get(setting):
            env[setting] = stack.values[key]
            stack.applied.add(setting)
    return stack.applied
