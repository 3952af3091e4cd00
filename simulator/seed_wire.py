"""Protocol 7 as the seeds write it: every frame, command body, shard answer and reason
sentence they quote, each with the line of ``../shared/seeds/004_15575f6fbdbb98d9.txt``
(``S004``) or ``000_17c043ca07765dbb.txt`` (``S000``) it comes from.

This table is the simulator's vocabulary and the conformance suite's fixtures: the
simulator may say no kind and no sentence that is not here, and tests/conformance drives
every row through the real gateway, cleanup and reconcile.

Where the seeds name a thing but do not spell its whole shape (the success kind of
``world.spawn``, the key layout of ``world.despawn``'s three answers, the entries of
``lease.list``), the row says ``inferred`` and names the seed lines it is read from; those
readings are also written down in docs/gateway.md, "What the seeds leave open".
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

SEED = "004_15575f6fbdbb98d9.txt"
"""The sidecar seed: the authority on the shard wire."""

PROTOCOL = 7
"""``PROTOCOL_VERSION`` (S004:556)."""


@dataclass(frozen=True)
class Quote:
    """One thing a seed says on the wire, and where."""

    line: int
    value: Any
    inferred: bool = False


# --- frames a shard sends ---------------------------------------------------------------

HELLO = Quote(295, {"t": 1733000000000, "kind": "server.hello", "shard": "uo1", "protocol": 7,
                    "token": "…"})
"""The first line (kind: S004:295; fields: docs/gateway.md, "Wire", quoting the sidecar's hello)."""

GUILD_UPDATE = Quote(827, {"kind": "guild.update", "id": 7, "name": "The Cartographers", "abbr": "MAP",
                           "members": 2, "online": 1})
GUILD_UPDATE_LATE = Quote(871, {"kind": "guild.update", "id": 9, "name": "Late Arrivals", "abbr": "LTE"})
GUILD_UPDATE_UNSWEPT = Quote(894, {"kind": "guild.update", "id": 11, "name": "Unswept"})
ROSTER_MEMBERS = Quote(836, [{"serial": "0x1", "name": "Ada"}, {"serial": "0x2", "name": "Bo"}])
ROSTER_MEMBERS_LATE = Quote(864, [{"serial": "0x3", "name": "Cy"}])
GUILD_ROSTER_FIELDS = Quote(264, ("id", "seq", "more", "members"))
"""``guild.roster`` carries the guild ``id``, ``seq`` (default 0), ``more`` (default false) and
``members`` (a missing or non-array one is an empty list: ``unwrap_or_default``, S004:276)."""
GUILD_REMOVE_FIELDS = Quote(290, ("id",))
MAX_ROSTER_MEMBERS = Quote(317, 50_000)

FORWARDED_KINDS = {
    "guild.leave": 253,          # forwarded only; the next roster corrects the board
    "house.decay": 523,          # ownerName, nextStage, decayPeriodSec, dynamicDecay, estimatedCollapse
    "vendor.listing": 525,       # ownerAcct, fees {charge, funds, pay interval, dismissalAt}
    "vendor.listing.remove": 507,
    "account.login.attempt": 530,
    "account.login.result": 529,
    "champ.update": 550,         # bossUp
    "champ.boss.killed": 549,    # the damage table
    "mob.killed": 551,
    "world.save.before": 1324,
    "world.save.after": 1324,
}
"""Frame kinds the seed names besides the guild board's (line of the first mention)."""

# --- lines the sidecar sends a shard ----------------------------------------------------

NEWS_ADD = Quote(293, {"kind": "news.add", "announce": False})
"""News is replayed to the shard after each hello as ``news.add`` with ``announce: false``
(S004:292-294: "news.add is idempotent by id")."""

# --- commands: route, verb, body (S004:911-951, 1131-1333) ------------------------------

COMMAND_BODIES: dict[str, Quote] = {
    "admin.ban": Quote(1082, {"actor": "gm-ada", "account": "alice", "durationSec": 3600, "reason": "spam"}),
    "admin.unban": Quote(1082, {"actor": "gm-ada", "account": "alice"}),
    "admin.broadcast": Quote(1082, {"actor": "gm-ada", "text": "Server restart in 5 minutes", "hue": 33}),
    "lease.list": Quote(1150, {}),
    "lease.apply": Quote(1173, {"key": "PlayerCaps.SkillCap", "value": "1300", "holdMs": 600_000,
                                "untilMs": 1733000600000, "runId": "42", "idempotencyKey": "run42:step3"}),
    "lease.release": Quote(1186, {"key": "PlayerCaps.SkillCap", "expected": "1300", "baseline": "1200",
                                  "idempotencyKey": "run42:teardown:lease"}),
    "participation.open": Quote(1198, {"runId": "42", "map": "Felucca", "x": 1400, "y": 1600, "radius": 30,
                                       "holdMs": 3_600_000}),
    "participation.snapshot": Quote(1210, {"idempotencyKey": "run42:snapshot"}),
    "participation.close": Quote(1229, {"idempotencyKey": "run42:close"}),
    "world.spawn": Quote(1245, {"runId": "42", "what": "creature", "map": "Felucca", "x": 1400, "y": 1600}),
    "world.owned": Quote(1267, {"runId": "42"}),
    "world.despawn": Quote(1270, {"serials": []}),
    "item.catalog": Quote(1299, {}),
    "item.grant": Quote(1302, {"runId": "42", "item": "gold", "amount": 500, "idempotencyKey": "run42:grant"}),
    "world.save": Quote(1321, {"idempotencyKey": "run42:save"}),
    "pages.list": Quote(1337, {}),
}
"""A body per verb, as the seed's route comments give it (``runId`` from a path is in the body)."""

# --- what a shard answers ---------------------------------------------------------------

BUSY = Quote(1348, {"t": 1, "kind": "bridge.busy", "reqId": "r-9"})
REPLAYED = Quote(1582, {"t": 1, "kind": "admin.ok", "reqId": "r-9", "replayed": True})
DRIFTED = Quote(1373, {"kind": "lease.drifted", "key": "PlayerCaps.SkillCap", "current": "1300"})
OWNED_NOTHING = Quote(1450, {"kind": "world.owned.ok", "runId": "77", "owned": [], "pruned": 0})
GRANTED_NOBODY = Quote(1513, {"kind": "item.grant.ok", "runId": "42", "granted": 0, "missed": []})

ANSWER_KINDS: dict[str, Quote] = {
    "bridge.busy": Quote(968, None),
    "bridge.error": Quote(979, None),
    "admin.ok": Quote(1582, None),
    "admin.error": Quote(990, None),
    "account.error": Quote(1075, None),
    "lease.ok": Quote(1561, None),
    "lease.list.ok": Quote(1562, None),
    "lease.drifted": Quote(1373, None),
    "lease.error": Quote(1393, None),
    "participation.ok": Quote(1563, None),
    "participation.snapshot.ok": Quote(1565, None),
    "participation.error": Quote(1401, None),
    "world.owned.ok": Quote(1450, None),
    "world.error": Quote(1421, None),
    "item.grant.ok": Quote(1513, None),
    "oneshot.error": Quote(1502, None),
    "pages.list": Quote(1337, None),
    # Named by the seed only through the pattern of its siblings (`<verb>.ok`).
    "world.spawn.ok": Quote(1245, None, inferred=True),
    "world.despawn.ok": Quote(1270, None, inferred=True),
    "item.catalog.ok": Quote(1292, None, inferred=True),
    "world.save.ok": Quote(1321, None, inferred=True),
    "account.ok": Quote(1065, None, inferred=True),
    "pages.ok": Quote(1337, None, inferred=True),
}
"""Every kind a shard answers a command with (line of the seed that names it)."""

DESPAWN_RESULTS = Quote(1273, ("removed", "gone", "refused"))
"""``world.despawn``'s three answers; ``removed`` and ``gone`` are successes (S004:1273-1276).
Their layout — one list of serials under each name — is shardbus's reading (inferred)."""

LEASE_LIST_FIELDS = Quote(1137, ("held", "expired", "holds"))
"""``lease.list.ok``: the catalog with current values, ``held``, ``expired: true`` for a lease
whose deadline fired but teardown has not collected, and ``holds`` (S004:1137-1149)."""

# --- reason sentences, as patterns (the seed's example values are the groups) -----------

REASONS: dict[str, Quote] = {
    "event plane disabled": Quote(1394, r"the event plane is disabled on this shard \(Bridge\.EventsEnabled\)"),
    "no such lease": Quote(1473, r"no lease is offered for key '[^']*'"),
    "hold must be positive": Quote(1489, r"a lease needs a positive holdMs"),
    "run not counted": Quote(1481, r"this shard is not counting run '[^']*'"),
    "spawn over the ceiling": Quote(1423, r"this shard places 1 to \d+ of '[a-z]+' at a time, and -?\d+ was asked for"),
    "no ledger for a grant": Quote(1503, r"run \S+ has no participation ledger open on this shard"),
    "save too soon": Quote(1530, r"this shard saves at most every \d+ seconds, and the last save was \d+ seconds ago"),
    "not granted here": Quote(1541, r"this shard does not grant '[^']*'"),
    "unknown account": Quote(1593, r"unknown account"),
    "protected": Quote(1599, r"protected"),
    "already exists": Quote(1604, r"already exists"),
    "not linked": Quote(1067, r"not linked"),
}
"""Every reason sentence a shard may give, as a full-match pattern."""

SENTENCE_EXAMPLES: dict[str, Quote] = {
    "event plane disabled": Quote(1394, "the event plane is disabled on this shard (Bridge.EventsEnabled)"),
    "no such lease": Quote(1473, "no lease is offered for key 'Loot.MaxProps'"),
    "hold must be positive": Quote(1489, "a lease needs a positive holdMs"),
    "run not counted": Quote(1481, "this shard is not counting run '42'"),
    "spawn over the ceiling": Quote(1423, "this shard places 1 to 30 of 'creature' at a time, and 80 was asked for"),
    "no ledger for a grant": Quote(1503, "run 42 has no participation ledger open on this shard"),
    "save too soon": Quote(1530, "this shard saves at most every 300 seconds, and the last save was 12 seconds ago"),
    "not granted here": Quote(1541, "this shard does not grant 'castle'"),
    "unknown account": Quote(1593, "unknown account"),
    "protected": Quote(1599, "protected"),
    "already exists": Quote(1604, "already exists"),
}
"""The seed's own example of each sentence, verbatim."""


def is_seed_reason(reason: object) -> bool:
    """True when ``reason`` is one of the seed's sentences (any of its example values)."""
    return isinstance(reason, str) and any(re.fullmatch(q.value, reason) for q in REASONS.values())


# --- the reply table: (plane's error kind, reason) → status (S004:975-1063, 1343-1609) --

STATUS_ROWS: tuple[tuple[str, dict[str, Any], int, int], ...] = (
    # (verb, the shard's answer, status, seed line)
    ("lease.apply", {"kind": "bridge.busy"}, 425, 1357),
    ("admin.ban", {"kind": "bridge.busy"}, 425, 1358),
    ("account.create", {"kind": "bridge.busy"}, 425, 1360),
    ("participation.snapshot", {"kind": "bridge.busy"}, 425, 1363),
    ("lease.release", DRIFTED.value, 200, 1379),
    ("lease.apply", {"kind": "lease.error", "reason": SENTENCE_EXAMPLES["event plane disabled"].value}, 403, 1397),
    ("participation.open", {"kind": "participation.error",
                            "reason": SENTENCE_EXAMPLES["event plane disabled"].value}, 403, 1405),
    ("world.spawn", {"kind": "world.error", "action": "spawn",
                     "reason": SENTENCE_EXAMPLES["spawn over the ceiling"].value}, 400, 1426),
    ("world.spawn", {"kind": "world.error", "action": "spawn",
                     "reason": SENTENCE_EXAMPLES["event plane disabled"].value}, 403, 1435),
    ("world.owned", OWNED_NOTHING.value, 200, 1456),
    ("lease.apply", {"kind": "lease.error", "reason": SENTENCE_EXAMPLES["no such lease"].value}, 404, 1476),
    ("participation.snapshot", {"kind": "participation.error",
                                "reason": SENTENCE_EXAMPLES["run not counted"].value}, 404, 1484),
    ("lease.apply", {"kind": "lease.error", "reason": SENTENCE_EXAMPLES["hold must be positive"].value}, 400, 1492),
    ("item.grant", {"kind": "oneshot.error", "reason": SENTENCE_EXAMPLES["no ledger for a grant"].value}, 404, 1506),
    ("item.grant", GRANTED_NOBODY.value, 200, 1519),
    ("world.save", {"kind": "oneshot.error", "reason": SENTENCE_EXAMPLES["save too soon"].value}, 429, 1533),
    ("item.grant", {"kind": "oneshot.error", "reason": SENTENCE_EXAMPLES["not granted here"].value}, 400, 1544),
    ("world.save", {"kind": "oneshot.error", "reason": SENTENCE_EXAMPLES["event plane disabled"].value}, 403, 1554),
    ("lease.apply", {"kind": "lease.ok"}, 200, 1561),
    ("lease.list", {"kind": "lease.list.ok"}, 200, 1562),
    ("participation.open", {"kind": "participation.ok"}, 200, 1563),
    ("participation.snapshot", {"kind": "participation.snapshot.ok"}, 200, 1565),
    ("admin.ban", REPLAYED.value, 200, 1584),
    ("pages.list", {"kind": "bridge.error", "reason": SENTENCE_EXAMPLES["unknown account"].value}, 404, 1596),
    ("admin.ban", {"kind": "admin.error", "reason": SENTENCE_EXAMPLES["protected"].value}, 403, 1600),
    ("account.create", {"kind": "account.error", "reason": SENTENCE_EXAMPLES["already exists"].value}, 409, 1607),
    ("account.unlink", {"kind": "account.error", "reason": "not linked"}, 404, 1067),
)
"""Every mapping row the seed's tests and comments pin, with the status the website sees."""
