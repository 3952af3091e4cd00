#!/usr/bin/env python3
"""Before `compose up`: every host port compose.yaml publishes, as the environment and .env set
it, and whether another process holds it (docs/operations.md, "Compose for real").

    python3 deploy/check-ports.py [--profile monitoring] [--env-file .env]

One line a taken port, naming the variable that moves it, and exit 1; else one line and exit 0.
(The engine would say only "listen tcp4 :4222: bind: address already in use".) Ranges are
checked port by port; an empty port (``0.0.0.0:``, the engine picks) is not checked.
"""

from __future__ import annotations

import argparse
import os
import re
import socket
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PORT = re.compile(r'^\s*-\s*"(?:(?P<ip>[\d.]+):)?\$\{(?P<var>\w+):-(?P<default>[^}]*)\}:(?P<target>\d+)"')


def published(compose: str, profiles: set[str]) -> list[tuple[str, str, str, str]]:
    """(service, variable, default, bind address) of each host port, the services of the given
    profiles included."""
    found, service, profile = [], "", ""
    for line in compose.splitlines():
        if match := re.match(r"^  ([\w-]+):\s*$", line):
            service, profile = match.group(1), ""
        elif match := re.match(r"^    profiles: \[(\w+)\]", line):
            profile = match.group(1)
        elif (match := PORT.match(line)) and (not profile or profile in profiles):
            found.append((service, match["var"], match["default"], match["ip"] or "0.0.0.0"))
    return found


def env_file(path: Path) -> dict[str, str]:
    values = {}
    if path.exists():
        for line in path.read_text().splitlines():
            key, sep, value = line.strip().partition("=")
            if sep and not key.startswith("#"):
                values[key.strip()] = value.strip().strip("'\"")
    return values


def ports(value: str) -> tuple[str | None, list[int]]:
    """The address and ports a variable's value publishes (``2595-2604``, ``4223``,
    ``127.0.0.1:`` → none)."""
    address, _, rest = value.rpartition(":")
    if not rest:
        return address or None, []
    low, _, high = rest.partition("-")
    return address or None, list(range(int(low), int(high or low) + 1))


def taken(address: str, port: int) -> bool:
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((address, port))
        except OSError:
            return True
    return False


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--profile", action="append", default=[])
    parser.add_argument("--env-file", type=Path, default=ROOT / ".env")
    args = parser.parse_args()
    values = {**env_file(args.env_file), **os.environ}
    problems, checked = [], 0
    for service, variable, default, bind in published((ROOT / "compose.yaml").read_text(), set(args.profile)):
        value = values.get(variable) or default
        address, numbers = ports(value)
        busy = [port for port in numbers if taken(address or bind, port)]
        checked += len(numbers)
        if busy and len(busy) == len(numbers):
            problems.append(f"port {value} of {service} ({variable}) is taken on this machine: "
                            f"set {variable} to a free port (compose.yaml; default {default})")
        elif busy:
            print(f"note: {variable}={value} ({service}): {', '.join(map(str, busy))} taken, "
                  f"{len(numbers) - len(busy)} free for replicas")
    for problem in problems:
        print(problem, file=sys.stderr)
    if not problems:
        print(f"compose.yaml's host ports: {checked} checked, none taken")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
