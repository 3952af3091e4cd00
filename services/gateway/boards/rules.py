"""Boards, declared as data: which frame kind upserts or deletes which item of which board,
the reassembly of chunked guild rosters, and the folding of a board's keys into items.
Pure; the key-value I/O is in ``board_store.py``.

The kinds and ids are the sidecar seed's (docs/gateway.md, "Boards", has the table):
a guild is named by its top-level integer ``id``, listings by ``serial``.
A board is a JetStream key-value bucket. An item of shard ``s`` with id ``i`` is stored under
``s.i.<part>``: most boards have one part (``item``, the frame as the shard sent it); the guild
board has two writers, ``snapshot`` (``guild.update``, verbatim) and ``roster`` (``guild.roster``),
so neither overwrites the other, in either order. Reading folds the roster into
the snapshot as ``roster``; a roster with no snapshot yet is a row of its own.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

MAX_ROSTER_MEMBERS = 50_000
"""A partial roster growing past this many members is discarded (docs/gateway.md, "Boards", "Roster reassembly")."""

MAX_PARTIAL_BYTES = 16 * 1024 * 1024
"""The most bytes of roster lines one connection's partial rosters may hold, all guilds
together; past it the oldest partials are discarded. (The member cap bounds one guild's count,
not its bytes, nor how many guilds a shard leaves half sent: a hostile shard could otherwise
make the gateway hold any amount. A real roster of 50,000 members is about 3 MB.)"""

_SAFE_ID = re.compile(r"[A-Za-z0-9_=-]{1,64}")

MAX_GUILD_ID = 2**63 - 1
"""A guild id is the seed's i64 (it reads one with ``as_i64``)."""


@dataclass(frozen=True)
class BoardRule:
    """One kind's effect on a board: ``upsert`` stores ``value`` (a dotted path into the frame,
    or the whole frame) as ``part`` of the item whose id is at the first of ``id_paths``
    present (an integer only, when ``integer_id``); ``delete`` removes every part of that item."""

    kind: str
    board: str
    id_paths: tuple[str, ...]
    action: str = "upsert"
    part: str = "item"
    value: str | None = None
    integer_id: bool = False


BOARD_RULES: tuple[BoardRule, ...] = (
    BoardRule("guild.update", "guilds", ("id",), part="snapshot", integer_id=True),
    BoardRule("guild.roster", "guilds", ("id",), part="roster", value="members", integer_id=True),
    BoardRule("guild.remove", "guilds", ("id",), action="delete", integer_id=True),
    BoardRule("vendor.listing", "market", ("serial",)),
    BoardRule("vendor.listing.remove", "market", ("serial",), action="delete"),
    BoardRule("house.decay", "houses", ("serial",)),
    BoardRule("champ.update", "champions", ("serial", "id")),
)
"""Every board-writing kind the seed names. ``guild.leave`` is only forwarded: the next roster
corrects the board. The seed's ruleset, points and governor boards are written by kinds it does
not quote, so no rule can be declared for them yet (docs/gateway.md, "What the seeds leave open")."""

RULES_BY_KIND = {rule.kind: rule for rule in BOARD_RULES}
"""The rule for a frame kind."""

BOARDS: dict[str, tuple[str, ...]] = {}
"""Each board's item parts (the keys one item may have)."""
for _rule in BOARD_RULES:
    if _rule.action == "upsert" and _rule.part not in BOARDS.setdefault(_rule.board, ()):
        BOARDS[_rule.board] += (_rule.part,)
BOARDS["news"] = ("item",)


def bucket_name(prefix: str, board: str) -> str:
    """The key-value bucket of ``board``, e.g. ``BOARD_GUILDS``."""
    return f"{prefix}_{board.upper()}"


def dig(frame: dict[str, Any], path: str) -> Any:
    """The value at a dotted path in ``frame`` (None when absent)."""
    value: Any = frame
    for step in path.split("."):
        if not isinstance(value, dict):
            return None
        value = value.get(step)
    return value


def item_id(rule: BoardRule, frame: dict[str, Any]) -> str | None:
    """The item's id as a key token, or None when the frame names no usable id."""
    for path in rule.id_paths:
        value = dig(frame, path)
        if isinstance(value, bool) or not isinstance(value, (int, str)):
            continue
        if rule.integer_id:
            return str(value) if isinstance(value, int) and -MAX_GUILD_ID - 1 <= value <= MAX_GUILD_ID else None
        text = str(value)
        return text if _SAFE_ID.fullmatch(text) else None
    return None


def unusable(rule: BoardRule) -> str:
    """Why a frame of ``rule``'s kind could not be written to its board."""
    wanted = "an integer" if rule.integer_id else "1-64 letters, digits, _ = or -"
    return f"board {rule.board} cannot use this {rule.kind}: its {' or '.join(rule.id_paths)} must be {wanted}"


def stored_value(rule: BoardRule, frame: dict[str, Any]) -> Any:
    """What an upsert stores: the frame as the shard sent it (as the seed persists every frame:
    whole; docs/gateway.md, "Boards"), or the declared part (a roster's members)."""
    if rule.value is None:
        return frame
    return dig(frame, rule.value)


def item_key(shard: str, item: str, part: str) -> str:
    """The key-value key of one part of one item."""
    return f"{shard}.{item}.{part}"


def fold(board: str, entries: dict[str, Any]) -> list[dict[str, Any]]:
    """A board's items from its keys (``item.part`` → value), in board order: by name, then id.

    Guilds: the snapshot with the roster folded in as ``roster``; a guild with no roster
    yet has no ``roster`` key (unknown is not empty); a roster that came before
    any snapshot is a row of its own, ``{"id", "roster"}`` (docs/gateway.md, "Boards")."""
    parts: dict[str, dict[str, Any]] = {}
    for key, value in entries.items():
        item, _, part = key.rpartition(".")
        parts.setdefault(item, {})[part] = value
    items = []
    for item, found in parts.items():
        if board == "guilds":
            snapshot = found.get("snapshot")
            entry = dict(snapshot) if isinstance(snapshot, dict) else {}
            if "roster" in found:
                entry["roster"] = found["roster"]
        else:
            value = found.get("item")
            entry = dict(value) if isinstance(value, dict) else {"value": value}
        entry.setdefault("id", _number(item))
        items.append(entry)
    return sorted(items, key=lambda e: (str(e.get("name") or e.get("title") or ""), _sort_id(e.get("id"))))


def _number(text: str) -> int | str:
    return int(text) if re.fullmatch(r"-?[0-9]{1,19}", text) else text


def _sort_id(value: Any) -> tuple[int, Any]:
    return (0, value) if isinstance(value, int) else (1, str(value))


class RosterAssembler:
    """Reassembles chunked ``guild.roster`` frames of one connection, per guild.

    ``seq`` 0 starts afresh; a one-frame roster is complete at once; an out-of-order ``seq``
    discards the partial; a continuation with no start is ignored; guilds interleave; an
    empty member list is a complete roster; past :data:`MAX_ROSTER_MEMBERS` the partial is
    discarded. A new connection (a new ``server.hello``) starts with no partials."""

    def __init__(self, max_members: int = MAX_ROSTER_MEMBERS, max_bytes: int = MAX_PARTIAL_BYTES) -> None:
        self.max_members = max_members
        self.max_bytes = max_bytes
        self.partials: dict[str, tuple[int, list[Any]]] = {}
        self._bytes: dict[str, int] = {}
        self.held_bytes = 0
        """Bytes of the lines the partials were made of."""
        self.evicted = 0
        """Partials discarded because all of them together held too much."""

    def _drop(self, guild: str) -> list[Any] | None:
        self.held_bytes -= self._bytes.pop(guild, 0)
        partial = self.partials.pop(guild, None)
        return None if partial is None else partial[1]

    def take(self, guild: str, frame: dict[str, Any], size: int = 0) -> list[Any] | None:
        """Add one roster frame (``size``: its line's bytes); the whole member list once
        complete, else None.

        Read as the seed reads it (docs/gateway.md, "Boards"): ``seq`` an integer or 0, ``more`` true or
        false, ``members`` an array or empty (a missing or non-array one is a complete empty
        roster, not a discarded frame)."""
        seq = frame.get("seq")
        seq = seq if isinstance(seq, int) and not isinstance(seq, bool) else 0
        more = frame.get("more") is True
        members = frame.get("members")
        members = members if isinstance(members, list) else []
        held = self._bytes.get(guild, 0)
        if seq == 0:
            self._drop(guild)
            collected: list[Any] = []
            held = 0
        elif guild in self.partials and self.partials[guild][0] == seq:
            collected = self._drop(guild) or []
        else:  # out of order, or a continuation with no start
            self._drop(guild)
            return None
        collected.extend(members)
        if len(collected) > self.max_members:
            return None
        if more:
            self.partials[guild] = (seq + 1, collected)
            self._bytes[guild] = held + size
            self.held_bytes += held + size
            while self.held_bytes > self.max_bytes and self.partials:
                self._drop(next(iter(self.partials)))  # the oldest first (this one last)
                self.evicted += 1
            return None
        return collected


Op = tuple[str, str, str, Any]
"""A key-value write: ``("put"|"delete", board, key, value)``."""


def board_ops(shard: str, kind: str, frame: dict[str, Any],
              rosters: RosterAssembler, size: int = 0) -> tuple[list[Op], str | None]:
    """The key-value writes a frame causes, and why a board kind's frame could not be used
    (None when it could, or when the kind writes no board). A ``guild.roster`` frame writes
    only once its roster is whole."""
    rule = RULES_BY_KIND.get(kind)
    if rule is None:
        return [], None
    item = item_id(rule, frame)
    if item is None:
        return [], unusable(rule)
    if rule.action == "delete":
        return [("delete", rule.board, item_key(shard, item, part), None) for part in BOARDS[rule.board]], None
    if kind == "guild.roster":
        members = rosters.take(item, frame, size)
        if members is None:
            return [], None
        return [("put", rule.board, item_key(shard, item, rule.part), members)], None
    return [("put", rule.board, item_key(shard, item, rule.part), stored_value(rule, frame))], None
