"""Boards, declared as data: which frame kind upserts or deletes which item of which board,
the reassembly of chunked guild rosters, and the folding of a board's keys into items.
Pure; the key-value I/O is in ``board_store.py``.

A board is a JetStream key-value bucket. An item of shard ``s`` with id ``i`` is stored under
``s.i.<part>``: most boards have one part (``item``); the guild board has two writers,
``snapshot`` (``guild.update``) and ``roster`` (``guild.roster``), so neither overwrites the
other, in either order. Reading folds the roster into the snapshot as ``roster``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

MAX_ROSTER_MEMBERS = 50_000
"""A partial roster growing past this many members is discarded (bounded memory per shard)."""

_SAFE_ID = re.compile(r"^[A-Za-z0-9_=-]{1,64}$")


@dataclass(frozen=True)
class BoardRule:
    """One kind's effect on a board: ``upsert`` stores ``value`` (a dotted path into the frame,
    or the whole frame) as ``part`` of the item whose id is at the first of ``id_paths``
    present; ``delete`` removes every part of that item."""

    kind: str
    board: str
    id_paths: tuple[str, ...]
    action: str = "upsert"
    part: str = "item"
    value: str | None = None


BOARD_RULES: tuple[BoardRule, ...] = (
    BoardRule("guild.update", "guilds", ("guild.id", "guildId"), part="snapshot", value="guild"),
    BoardRule("guild.roster", "guilds", ("guild", "guildId"), part="roster", value="members"),
    BoardRule("guild.remove", "guilds", ("guild", "guild.id", "guildId"), action="delete"),
    BoardRule("vendor.listing", "vendors", ("serial", "listing.serial")),
    BoardRule("vendor.listing.remove", "vendors", ("serial", "listing.serial"), action="delete"),
    BoardRule("house.update", "houses", ("house.serial", "serial"), value="house"),
    BoardRule("house.remove", "houses", ("house.serial", "serial", "house"), action="delete"),
    BoardRule("champion.update", "champions", ("champion.id", "id"), value="champion"),
    BoardRule("champion.remove", "champions", ("champion.id", "id", "champion"), action="delete"),
)
"""Every board-writing kind. ``guild.leave`` is only forwarded: the next roster corrects the board."""

RULES_BY_KIND = {rule.kind: rule for rule in BOARD_RULES}
"""The rule for a frame kind."""

BOARDS: dict[str, tuple[str, ...]] = {}
"""Each board's item parts (the keys one item may have)."""
for _rule in BOARD_RULES:
    if _rule.action == "upsert" and _rule.part not in BOARDS.setdefault(_rule.board, ()):
        BOARDS[_rule.board] += (_rule.part,)
BOARDS["news"] = ("item",)

ENVELOPE = ("kind", "t", "seq", "more", "reqId")
"""Frame fields that are not part of a whole-frame value."""


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
        text = str(value)
        return text if _SAFE_ID.match(text) else None
    return None


def stored_value(rule: BoardRule, frame: dict[str, Any]) -> Any:
    """What an upsert stores: the declared part of the frame, or the frame without its envelope."""
    if rule.value is None:
        return {k: v for k, v in frame.items() if k not in ENVELOPE}
    return dig(frame, rule.value)


def item_key(shard: str, item: str, part: str) -> str:
    """The key-value key of one part of one item."""
    return f"{shard}.{item}.{part}"


def fold(board: str, entries: dict[str, Any]) -> list[dict[str, Any]]:
    """A board's items from its keys (``item.part`` → value), in board order: by name, then id.

    Guilds: the snapshot with the roster folded in as ``roster``; a guild with no roster
    yet has no ``roster`` key (unknown is not empty); a roster without a snapshot waits."""
    parts: dict[str, dict[str, Any]] = {}
    for key, value in entries.items():
        item, _, part = key.rpartition(".")
        parts.setdefault(item, {})[part] = value
    items = []
    for item, found in parts.items():
        if board == "guilds":
            if not isinstance(found.get("snapshot"), dict):
                continue
            entry = dict(found["snapshot"])
            if "roster" in found:
                entry["roster"] = found["roster"]
        else:
            value = found.get("item")
            entry = dict(value) if isinstance(value, dict) else {"value": value}
        entry.setdefault("id", _number(item))
        items.append(entry)
    return sorted(items, key=lambda e: (str(e.get("name", e.get("title", ""))), _sort_id(e.get("id"))))


def _number(text: str) -> int | str:
    return int(text) if text.isdigit() else text


def _sort_id(value: Any) -> tuple[int, Any]:
    return (0, value) if isinstance(value, int) else (1, str(value))


class RosterAssembler:
    """Reassembles chunked ``guild.roster`` frames of one connection, per guild.

    ``seq`` 0 starts afresh; a one-frame roster is complete at once; an out-of-order ``seq``
    discards the partial; a continuation with no start is ignored; guilds interleave; an
    empty member list is a complete roster; past :data:`MAX_ROSTER_MEMBERS` the partial is
    discarded. A new connection (a new ``server.hello``) starts with no partials."""

    def __init__(self, max_members: int = MAX_ROSTER_MEMBERS) -> None:
        self.max_members = max_members
        self.partials: dict[str, tuple[int, list[Any]]] = {}

    def take(self, guild: str, frame: dict[str, Any]) -> list[Any] | None:
        """Add one roster frame; the whole member list once complete, else None."""
        seq, members, more = frame.get("seq", 0), frame.get("members"), frame.get("more") is True
        if type(seq) is not int or not isinstance(members, list):
            self.partials.pop(guild, None)
            return None
        if seq == 0:
            collected: list[Any] = []
        elif guild in self.partials and self.partials[guild][0] == seq:
            collected = self.partials.pop(guild)[1]
        else:  # out of order, or a continuation with no start
            self.partials.pop(guild, None)
            return None
        collected.extend(members)
        if len(collected) > self.max_members:
            self.partials.pop(guild, None)
            return None
        if more:
            self.partials[guild] = (seq + 1, collected)
            return None
        self.partials.pop(guild, None)
        return collected


def board_ops(shard: str, kind: str, frame: dict[str, Any],
              rosters: RosterAssembler) -> list[tuple[str, str, str, Any]]:
    """The key-value writes a frame causes: ``("put"|"delete", board, key, value)``.

    A ``guild.roster`` frame writes only once its roster is whole."""
    rule = RULES_BY_KIND.get(kind)
    if rule is None:
        return []
    item = item_id(rule, frame)
    if item is None:
        return []
    if rule.action == "delete":
        return [("delete", rule.board, item_key(shard, item, part), None) for part in BOARDS[rule.board]]
    if kind == "guild.roster":
        members = rosters.take(item, frame)
        if members is None:
            return []
        return [("put", rule.board, item_key(shard, item, rule.part), members)]
    return [("put", rule.board, item_key(shard, item, rule.part), stored_value(rule, frame))]
