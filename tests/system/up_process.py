"""``shardbus up`` as a test drives it: started in a subprocess with a clean environment,
read until its ready line, and stopped with Ctrl-C, reporting whatever it left alive."""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil

from shardbus.process_stop import STOP_TIMEOUT_S

READY_WITHIN_S = 45
"""How long ``shardbus up`` may take to print its ready line."""

STOP_WAIT_S = 2 * (STOP_TIMEOUT_S + 2.0 + 15.0 + 5.0)
"""How long ``shardbus up`` may take to stop after Ctrl-C: twice its own bound (the services'
stop timeout, then PostgreSQL's 15 s, each kill's 5 s); 30 s was once too little on a loaded
machine (load average 11 on 2 cores: three tests killed an ``up`` that was still stopping)."""


def up_env() -> dict[str, str]:
    # The stack sets every SHARDBUS_ variable itself; a test run's own must not leak in.
    return {k: v for k, v in os.environ.items() if not k.startswith("SHARDBUS_")}


def start_up(state_dir: Path | None, *args: str, cwd: Path | None = None,
             env: dict[str, str] | None = None) -> tuple[subprocess.Popen, dict[str, str]]:
    """Start ``shardbus up`` with ``args`` (``state_dir`` None: its default, ``.shardbus`` in
    ``cwd``); return it and its KEY=value lines once ready (the whole output under ``"_lines"``)."""
    state = ["--state-dir", str(state_dir)] if state_dir is not None else []
    return start_command([sys.executable, "-m", "shardbus", "up", *state, *args], cwd=cwd, env=env)


def start_command(command: list[str], *, cwd: Path | None = None, env: dict[str, str] | None = None,
                  unset: tuple[str, ...] = (), new_session: bool = False) -> tuple[subprocess.Popen, dict[str, str]]:
    """Start a command that runs ``shardbus up`` (``shardbus up`` itself, or ``make up``) with
    ``env`` added to :func:`up_env` and ``unset`` removed; return it and its KEY=value lines once
    ready. ``new_session``: in a process group of its own, as a terminal runs it (:func:`stop_up`
    then sends Ctrl-C to the whole group)."""
    environment = {k: v for k, v in {**up_env(), **(env or {})}.items() if k not in unset}
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=environment, cwd=cwd, start_new_session=new_session)
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in proc.stdout], daemon=True).start()
    found: dict[str, str] = {}
    seen: list[str] = []
    deadline = time.monotonic() + READY_WITHIN_S
    while time.monotonic() < deadline:
        try:
            line = lines.get(timeout=0.5).rstrip("\n")
        except queue.Empty:
            if proc.poll() is not None:
                break
            continue
        seen.append(line)
        key, sep, value = line.partition("=")
        if sep and key.isupper():
            found[key] = value
        if "is ready" in line:
            found["_lines"] = "\n".join(seen)
            return proc, found
    stop_up(proc, group=new_session)
    raise AssertionError("shardbus up did not get ready:\n" + "\n".join(seen))


def stop_up(proc: subprocess.Popen, *, group: bool = False) -> list[psutil.Process]:
    """Ctrl-C ``shardbus up`` (``group``: its whole process group, as a terminal does); return
    whatever it started that is still alive after."""
    try:
        family = psutil.Process(proc.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        family = []
    if group:
        try:
            os.killpg(proc.pid, signal.SIGINT)
        except ProcessLookupError:
            pass
    else:
        proc.send_signal(signal.SIGINT)
    try:
        # Beyond up's own bound (services STOP_TIMEOUT_S + 2 s, then the servers at once, each
        # killed after 15 s at most): more than that is a wedged stop, not a slow machine.
        proc.wait(STOP_WAIT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(5)
    _gone, alive = psutil.wait_procs(family, timeout=10)
    for leftover in alive:  # never leave them behind, even when the assertion fails
        leftover.kill()
    return alive
