"""Service processes for tests: ``python -m shardbus run NAME`` with the test's servers,
waited on until healthy, each stopped by its own handle."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from shardbus.embedded import stop_process
from shared.health import health_file_is_fresh


@dataclass
class ServiceProcess:
    """One running service and where its log and health file are."""

    name: str
    proc: subprocess.Popen
    log_path: Path
    health_path: Path

    def log(self) -> str:
        """What the service logged so far."""
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


class ServiceProcesses:
    """Starts services for one test and stops every one of them."""

    def __init__(self, workdir: Path, nats_url: str) -> None:
        self.workdir = workdir
        self.nats_url = nats_url
        self.started: list[ServiceProcess] = []

    def start(self, service: str, *, timeout: float = 30.0, **settings: str) -> ServiceProcess:
        """Start ``service`` with ``SHARDBUS_<KEY>`` set from ``settings``; wait until healthy."""
        index = len(self.started)
        health = self.workdir / f"{service}-{index}.health"
        log_path = self.workdir / f"{service}-{index}.log"
        env = {**os.environ, "SHARDBUS_NATS_URL": self.nats_url, "SHARDBUS_HEALTH_FILE": str(health),
               "SHARDBUS_RECONNECT_WAIT_S": "0.2", "SHARDBUS_RECONNECT_WAIT_MAX_S": "1"}
        env.update({f"SHARDBUS_{key.upper()}": str(value) for key, value in settings.items()})
        with open(log_path, "ab") as log:
            proc = subprocess.Popen([sys.executable, "-m", "shardbus", "run", service], env=env,
                                    stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        handle = ServiceProcess(service, proc, log_path, health)
        self.started.append(handle)
        deadline = time.monotonic() + timeout
        while not health_file_is_fresh(str(health)):
            if proc.poll() is not None:
                raise RuntimeError(f"{service} exited with {proc.returncode}:\n{handle.log()[-3000:]}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"{service} not healthy within {timeout} s:\n{handle.log()[-3000:]}")
            time.sleep(0.05)
        return handle

    def stop(self, handle: ServiceProcess, sig: int = signal.SIGTERM) -> int:
        """Stop one service (SIGTERM, then kill after 10 s)."""
        return stop_process(handle.proc, sig, 10.0)

    def stop_all(self) -> None:
        for handle in self.started:
            stop_process(handle.proc, signal.SIGTERM, 10.0)
