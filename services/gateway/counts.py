"""What the gateway counts as it goes, in plain ints (the intake, the command relay and the
connections add to :class:`GatewayCounts`: at 20,000 frames/s a dict increment is all a frame can
afford); ``metrics.py`` reads them at scrape time. Every label value is from a known set, else
``other``: a shard's kind or reason never becomes a label."""

from __future__ import annotations

from services.gateway.shard_link.handshake import REFUSAL_LABELS
from shared.metrics import OTHER, Buckets

FRAME_KINDS = frozenset({
    # What a shard sends unasked (the hello, the boards' kinds, the forwarded ones:
    # docs/gateway.md, "Frames" and "Boards").
    "server.hello", "gateway.pong",
    "guild.update", "guild.roster", "guild.remove", "guild.leave",
    "house.decay", "vendor.listing", "vendor.listing.remove",
    "account.login.attempt", "account.login.result",
    "champ.update", "champ.boss.killed", "mob.killed", "world.save.before", "world.save.after",
    # What a shard answers commands with (simulator/seed_wire.py ANSWER_KINDS).
    "bridge.busy", "bridge.error", "admin.ok", "admin.error", "account.ok", "account.error",
    "lease.ok", "lease.list.ok", "lease.drifted", "lease.error",
    "participation.ok", "participation.snapshot.ok", "participation.error",
    "world.owned.ok", "world.error", "world.spawn.ok", "world.despawn.ok", "world.save.ok",
    "item.grant.ok", "item.catalog.ok", "oneshot.error", "pages.list", "pages.ok",
})
"""The ``kind`` label of ``frames_in_total``: the seed's shard → site kinds (else ``other``)."""

COMMAND_VERBS = frozenset({
    "admin.ban", "admin.unban", "admin.broadcast", "lease.list", "lease.apply", "lease.release",
    "participation.open", "participation.snapshot", "participation.close", "world.spawn", "world.owned",
    "world.despawn", "item.catalog", "item.grant", "world.save", "pages.list",
})
"""The seed's command verbs (simulator/seed_wire.py COMMAND_BODIES), lines the gateway writes."""

OUT_KINDS = COMMAND_VERBS | {"frame.ack", "gateway.ping", "news.add", "gateway.hello.refused"}
"""The ``kind`` label of ``frames_out_total``."""

DEAD_LETTER_REASONS: tuple[tuple[str, str], ...] = (
    ("not UTF-8", "not_utf8"),
    ("starts with a byte-order mark", "byte_order_mark"),
    ("malformed JSON", "malformed_json"),
    ("not a JSON object", "not_an_object"),
    ("frame has no kind", "no_kind"),
    ("kind is not a safe subject tail", "unsafe_kind"),
)
"""The dead-letter reason sentences of ``wire.sort_line`` by their start, and their label."""

BOARD_UNUSABLE = "board_unusable"
"""The label of a frame forwarded all the same whose board could not use it (``boards.board_ops``)."""

REASONS = frozenset(label for _, label in DEAD_LETTER_REASONS) | {BOARD_UNUSABLE}

SHARDS_KEPT = 10_000
"""Most shards whose last-frame time is kept after they disconnect (the oldest forgotten first)."""

SHARD_KEPT_S = 24 * 3600.0
"""A gone shard's last-frame time is forgotten this long after its last line."""


def reason_label(reason: str) -> str:
    """The ``reason`` label of a dead letter's reason sentence."""
    for start, label in DEAD_LETTER_REASONS:
        if reason.startswith(start):
            return label
    return OTHER


class GatewayCounts:
    """What the gateway counts as it goes (all since it started)."""

    def __init__(self) -> None:
        self.frames_in = dict.fromkeys((*sorted(FRAME_KINDS), OTHER), 0)
        self.frames_out = dict.fromkeys((*sorted(OUT_KINDS), OTHER), 0)
        self.dead_letters = dict.fromkeys((*sorted(REASONS), OTHER), 0)
        self.commands: dict[int, int] = {}
        """Replies to commands by status."""
        self.command_seconds = Buckets()
        self.reads_paused = 0
        """Times a shard's reading was paused for a line that had to wait (back-pressure)."""
        self.refusals = dict.fromkeys(REFUSAL_LABELS, 0)
        """Connections refused before they became a link, by reason (handshake.REFUSAL_LABELS)."""
        self.last_line_at: dict[str, float] = {}
        """Each shard's last line (unix time), kept after it disconnects (see :func:`collector`)."""

    def frame_in(self, kind: str) -> None:
        counts = self.frames_in
        counts[kind if kind in counts else OTHER] += 1

    def frame_out(self, kind: str, n: int = 1) -> None:
        counts = self.frames_out
        counts[kind if kind in counts else OTHER] += n

    def dead_letter(self, label: str) -> None:
        self.dead_letters[label if label in self.dead_letters else OTHER] += 1

    def refused(self, label: str) -> None:
        self.refusals[label if label in self.refusals else "tls_error"] += 1

    def replied(self, status: int, seconds: float | None) -> None:
        """A command's reply went out (``seconds`` since the request, when it was sent to the shard)."""
        status = status if 100 <= status <= 599 else 0
        self.commands[status] = self.commands.get(status, 0) + 1
        if seconds is not None:
            self.command_seconds.observe(seconds)

    def remember(self, shard: str, last_line_at: float) -> None:
        """A shard's last line (called at scrape time and when it disconnects)."""
        self.last_line_at[shard] = max(last_line_at, self.last_line_at.get(shard, 0.0))

    def forget_old(self, now: float) -> None:
        kept = self.last_line_at
        for shard in [s for s, at in list(kept.items()) if now - at > SHARD_KEPT_S]:
            del kept[shard]
        if len(kept) > SHARDS_KEPT:
            for shard, _ in sorted(list(kept.items()), key=lambda item: item[1])[:len(kept) - SHARDS_KEPT]:
                del kept[shard]
