"""The checker over a hosts run's whole history (docs/reliability.md, "Hosts"): what each shard
sent and was acknowledged (``shard_host.py``'s record) against what ``SHARD_FRAMES`` and
``SHARD_DEADLETTER`` hold at the end. Pure: the test reads the streams and hands them in."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any


@dataclass
class Verdict:
    """What the checker found: counts, and every violation (empty when every promise held)."""

    violations: list[str] = field(default_factory=list)
    sent: int = 0
    acked: int = 0
    stored: int = 0
    resent_deduplicated: int = 0

    def add(self, shard: str, what: str, seqs: list[int], described: list[str] | None = None) -> None:
        if seqs:
            each = described or [str(s) for s in seqs]
            shown = ", ".join(each[:5]) + (" …" if len(seqs) > 5 else "")
            self.violations.append(f"{shard}: {what}: {len(seqs)} ({shown})")

    def summary(self) -> str:
        return (f"{self.sent} frames sent, {self.acked} acknowledged, {self.stored} stored, "
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
