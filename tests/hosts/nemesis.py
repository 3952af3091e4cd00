"""The seeded nemesis of the hosts scenarios (docs/reliability.md, "Hosts", "The seeded
nemesis"): one seed drives every random choice a scenario makes — which node, when, for how
long — and every step it takes is recorded with its time, so that a failure can be replayed.

The seed is ``SHARDBUS_HOSTS_SEED`` when set, else a fresh one drawn when the test process
starts; each scenario draws from its own generator, ``random.Random("<seed>/<scenario>")``, so
that replaying one scenario does not depend on which others ran before it. Every choice is
drawn before the scenario acts (its plan), so the same seed makes the same plan; what the
cluster does in between (how long an election takes) varies, and is recorded in the steps.

    SHARDBUS_HOSTS_SEED=123456 make test-hosts
"""

from __future__ import annotations

import json
import os
import random
import signal
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TypeVar

from tests.hosts import harness

T = TypeVar("T")


def seed_from_environment() -> int:
    """``SHARDBUS_HOSTS_SEED``, else a fresh seed (from the OS's randomness)."""
    given = os.environ.get("SHARDBUS_HOSTS_SEED", "").strip()
    return int(given) if given else random.SystemRandom().randrange(1, 1_000_000)


SEED = seed_from_environment()
"""This test process's seed: the same for every scenario it runs."""


@dataclass
class Step:
    at_s: float
    """Seconds since the nemesis began (frames were flowing on every shard)."""
    what: str


@dataclass
class Schedule:
    """A scenario's seeded choices (its plan) and the timed steps it took."""

    scenario: str
    seed: int = SEED
    choices: dict[str, object] = field(default_factory=dict)
    steps: list[Step] = field(default_factory=list)
    began: float | None = None

    def __post_init__(self) -> None:
        self.rng = random.Random(f"{self.seed}/{self.scenario}")

    # --- the plan: every draw is named and recorded -------------------------------------------

    def choice(self, name: str, options: Sequence[T]) -> T:
        chosen = self.rng.choice(list(options))
        self.choices[name] = chosen
        return chosen

    def seconds(self, name: str, low: float, high: float) -> float:
        drawn = round(self.rng.uniform(low, high), 1)
        self.choices[name] = drawn
        return drawn

    def integer(self, name: str, low: int, high: int) -> int:
        drawn = self.rng.randint(low, high)
        self.choices[name] = drawn
        return drawn

    # --- the steps ----------------------------------------------------------------------------

    def begin(self) -> None:
        self.began = time.monotonic()

    def now(self) -> float:
        return 0.0 if self.began is None else round(time.monotonic() - self.began, 1)

    def step(self, what: str) -> None:
        """Record (and print, as it happens) one step of the nemesis."""
        self.steps.append(Step(self.now(), what))
        print(f"  nemesis +{self.now():5.1f} s  {what}", flush=True)

    # --- showing it ---------------------------------------------------------------------------

    def replay(self) -> str:
        return f"SHARDBUS_HOSTS_SEED={self.seed} make test-hosts"

    def header(self) -> str:
        plan = ", ".join(f"{k} {'; '.join(map(str, v)) if isinstance(v, list) else v}"
                         for k, v in self.choices.items())
        return f"hosts, {self.scenario}: seed {self.seed} ({self.replay()}); plan: {plan}"

    def describe(self) -> str:
        """The seed, the plan and every step: what a failure prints."""
        lines = [self.header(), "schedule:"]
        lines += [f"  +{s.at_s:5.1f} s  {s.what}" for s in self.steps] or ["  (no step taken)"]
        return "\n".join(lines)

    def write(self, folder: Path) -> None:
        """``seed.txt`` and ``schedule.json`` beside the run's logs."""
        (folder / "seed.txt").write_text(f"{self.seed}\n{self.replay()}\n")
        (folder / "schedule.json").write_text(json.dumps(
            {"scenario": self.scenario, "seed": self.seed, "replay": self.replay(), "choices": self.choices,
             "steps": [asdict(s) for s in self.steps]}, indent=1, default=str))


NODE_NAMES = ("nats-1", "nats-2", "nats-3")


def pause(started: harness.Started) -> None:
    """SIGSTOP: the process stops where it is (its sockets stay open, nothing answers)."""
    started.proc.send_signal(signal.SIGSTOP)


def resume(started: harness.Started) -> None:
    if started.proc.poll() is None:
        started.proc.send_signal(signal.SIGCONT)


def kill(started: harness.Started, timeout: float = 10.0) -> int:
    """SIGKILL, waited for: no shutdown, no flush beyond what was already synced."""
    started.proc.kill()
    return started.proc.wait(timeout)


def restart_node(processes: harness.Processes, node: harness.Node) -> None:
    """The node started again on its host with the same command (its configuration file and
    JetStream store are kept); the new handle replaces the old one on ``node``."""
    argv = [str(a) for a in node.started.proc.args]  # type: ignore[union-attr]
    inside = argv[argv.index(node.host.netns) + 1:]  # after "ip netns exec <netns>"
    node.started = processes.start(node.name, node.host, inside)


def up(node: harness.Node) -> bool:
    """The node's process runs and its monitoring port answers (``/varz``)."""
    if node.started.proc.poll() is not None:
        return False
    try:
        return bool(node.monitor("varz").get("server_name"))
    except (OSError, ValueError):
        return False
