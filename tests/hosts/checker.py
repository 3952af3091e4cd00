"""The checker over a hosts run's whole history (docs/reliability.md, "Hosts"): what each shard
sent and was acknowledged (``shard_host.py``'s record) against what ``SHARD_FRAMES`` and
``SHARD_DEADLETTER`` hold at the end, and every command the website host sent (``website_host.py``)
against the statuses a command may be answered. Pure: the test reads the streams and hands them in."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any

COMMAND_STATUSES = frozenset({200, 503, 504})
"""What the website host's ``item.catalog`` may be answered, on its subject or through the web
door's route (docs/contracts.md, "The gateway's own answers"; docs/web.md, "Statuses and the door's
own answers": 503 no shard connected, it left while the command waited, or the door's NATS is
reconnecting; 504 no answer in time); 400 and 409 need a request it never sends."""

NO_REPLY = frozenset({"timeout", "no responders", "connection lost"})
"""A command with no reply at all: "no responders" is the 503 of the command plane; a timeout is a
request or reply lost in the network (docs/contracts.md), as is an HTTP connection to the door
that broke: transient, counted, allowed during a fault."""

CALM_COMMANDS = 5
"""The last commands of each shard, sent once healed and drained: each must be answered 200."""


@dataclass
class Verdict:
    """What the checker found: counts, and every violation (empty when every promise held)."""

    violations: list[str] = field(default_factory=list)
    sent: int = 0
    acked: int = 0
    stored: int = 0
    resent_deduplicated: int = 0
    commands: Counter[str] = field(default_factory=Counter)
    """Commands by outcome: the status answered, or why there was no reply."""

    def add(self, shard: str, what: str, seqs: list[int], described: list[str] | None = None) -> None:
        if seqs:
            each = described or [str(s) for s in seqs]
            shown = ", ".join(each[:5]) + (" …" if len(seqs) > 5 else "")
            self.violations.append(f"{shard}: {what}: {len(seqs)} ({shown})")

    def summary(self) -> str:
        commands = ""
        if self.commands:
            each = ", ".join(f"{what} {n}" for what, n in sorted(self.commands.items()))
            commands = f", {sum(self.commands.values())} commands ({each})"
        return (f"{self.sent} frames sent, {self.acked} acknowledged, {self.stored} stored{commands}, "
                f"{len(self.violations)} violations")


def check(history: dict[str, Any], stored: dict[str, list[int]], dead_letters: dict[str, list[int]]) -> Verdict:
    """``history``: shard → {"sent", "acks", "unacked"} (seqs); ``stored``: shard → the seqs of
    its frames in ``SHARD_FRAMES`` in stream order; ``dead_letters``: shard → its messages in
    ``SHARD_DEADLETTER`` (their seqs, -1 for none). The promises (docs/gateway.md, "What a shard may rely on"):

    - every acknowledged frame is in ``SHARD_FRAMES``, exactly once;
    - a shard's frames are stored in the order it numbered them;
    - nothing is stored that the shard did not send;
    - no frame of a well-formed shard is given up on (dead-lettered);
    - once healed, nothing is left unacknowledged (every frame was resent until stored)."""
    verdict = Verdict()
    for shard, record in sorted(history.items()):
        sent, acks, unacked = record["sent"], record["acks"], record["unacked"]
        got = stored.get(shard, [])
        verdict.sent += len(sent)
        verdict.acked += len(set(acks))
        verdict.stored += len(got)
        counts = Counter(got)
        verdict.add(shard, "acknowledged but not in SHARD_FRAMES", sorted(set(acks) - set(counts)))
        verdict.add(shard, "stored more than once", sorted(s for s, n in counts.items() if n > 1))
        # Each one shown with the seq stored just before it (its shard's), to find the pair.
        verdict.add(shard, "stored out of the shard's order", [b for a, b in pairwise(got) if b <= a],
                    [f"{b} after {a}" for a, b in pairwise(got) if b <= a])
        verdict.add(shard, "stored but never sent", sorted(set(counts) - set(sent)))
        verdict.add(shard, "left unacknowledged after the heal", sorted(unacked))
        verdict.add(shard, "dead-lettered (given up on)", dead_letters.get(shard, []))
        verdict.resent_deduplicated += len(acks) - len(set(acks))
    return verdict


def check_commands(verdict: Verdict, outcomes: list[dict[str, Any]], shards: list[str]) -> None:
    """``outcomes``: every command the website host sent, in order (``website_host.py``'s lines).
    The promises (docs/contracts.md, "The gateway's own answers"): a command is answered with a
    documented status or not at all (the network lost it: a timeout, no responders), never with
    anything else; and once healed every command is answered 200 again (none stuck) — through NATS
    and through the web door each (an outcome without ``via`` is through NATS)."""
    for shard in shards:
        for via in sorted({o.get("via", "nats") for o in outcomes if o.get("shard") == shard} | {"nats"}):
            mine = [o for o in outcomes if o.get("shard") == shard and o.get("via", "nats") == via]
            if via == "nats":
                _check_one_way(verdict, shard, "", mine)
            else:
                _check_one_way(verdict, f"{shard} via {via}", f"{via} ", mine)


def _check_one_way(verdict: Verdict, shard: str, way: str, mine: list[dict[str, Any]]) -> None:
    """The commands of one shard sent one way (through NATS, or through the door: counted as
    ``door 200``…), in order."""
    for o in mine:
        verdict.commands[way + str(o["status"] if o.get("status") is not None else o.get("error"))] += 1
    odd = [(k, o) for k, o in enumerate(mine)
           if o.get("status") is not None and o["status"] not in COMMAND_STATUSES]
    verdict.add(shard, "commands answered with an undocumented status", [k for k, _ in odd],
                [f"#{k}: {o['status']}" for k, o in odd])
    failed = [(k, o) for k, o in enumerate(mine) if o.get("status") is None and o.get("error") not in NO_REPLY]
    verdict.add(shard, "commands failed otherwise than with no reply", [k for k, _ in failed],
                [f"#{k}: {o.get('error')}" for k, o in failed])
    if len(mine) < CALM_COMMANDS:
        verdict.violations.append(f"{shard}: only {len(mine)} commands sent, fewer than {CALM_COMMANDS}")
        return
    calm = [(k, o) for k, o in enumerate(mine) if k >= len(mine) - CALM_COMMANDS and o.get("status") != 200]
    verdict.add(shard, f"commands not answered 200 once healed (the last {CALM_COMMANDS})", [k for k, _ in calm],
                [f"#{k}: {o.get('status') or o.get('error')}" for k, o in calm])
