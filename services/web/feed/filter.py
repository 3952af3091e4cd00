"""What a feed client asked for: its query (``types``, ``shards``, ``kinds``, ``boards``,
``since``) checked value by value, the consumer filter subjects that let NATS do the filtering,
and the match that decides for each event (the authority: NATS's filtering only saves work).
Pure."""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from http import HTTPStatus

from shared.contracts.ids import SHARD_ID_PATTERN
from shared.errors import ShardbusError

TYPES = ("frame", "board", "ledger")
"""The kinds of event on the feed."""

MAX_VALUES = 64
"""Most values one filter parameter may list."""

MAX_FILTER_SUBJECTS = 64
"""Most filter subjects one consumer gets; beyond, a wider one and matching here."""

_SHARD = re.compile(SHARD_ID_PATTERN)
_KIND_TOKEN = r"(?:[A-Za-z0-9_-]+|\*)"
_KIND_FILTER = re.compile(rf"{_KIND_TOKEN}(?:\.{_KIND_TOKEN})*(?:\.>)?|>")
_BOARD = re.compile(r"[a-z0-9_-]{1,32}")
_SEQUENCE = re.compile(r"[0-9]{1,19}")
MAX_SEQUENCE = 2 ** 63 - 1


class FeedQueryError(ShardbusError, ValueError):
    """A query value the feed refuses; the message names the parameter and the value."""

    status = HTTPStatus.BAD_REQUEST


def shown(value: str) -> str:
    """A hostile value, quoted for an error sentence: ASCII only, at most 40 characters."""
    cut = value if len(value) <= 40 else value[:40] + "..."
    return ascii(cut)


def sequence(name: str, value: str | None) -> int | None:
    """A cursor (``since``, ``Last-Event-ID``): digits only, or None when absent."""
    if value is None:
        return None
    if _SEQUENCE.fullmatch(value) is None or int(value) > MAX_SEQUENCE:
        raise FeedQueryError(f"{name}: {shown(value)} is not a feed sequence (digits, as in an event's seq)")
    return int(value)


def _values(name: str, raw: Sequence[str]) -> list[str] | None:
    """``a,b`` and repeated parameters alike; None when the parameter is absent."""
    if not raw:
        return None
    values = [v for item in raw for v in item.split(",")]
    if len(values) > MAX_VALUES:
        raise FeedQueryError(f"{name}: at most {MAX_VALUES} values")
    return list(dict.fromkeys(values))  # repeats once, order kept


@dataclass(frozen=True)
class FeedFilter:
    """Which events one client gets. ``None`` means every value."""

    types: frozenset[str]
    shards: frozenset[str] | None = None
    kinds: tuple[str, ...] | None = None
    boards: frozenset[str] | None = None

    @classmethod
    def parse(cls, query: dict[str, list[str]], boards: Iterable[str]) -> FeedFilter:
        """From the query parameters (each name → its values); FeedQueryError names the first
        bad value. ``kinds`` narrows frames and ``boards`` boards; without ``types`` the types
        are those the other filters name (``kinds`` → frame, ``boards`` → board), else all."""
        known = tuple(boards)
        shards = _values("shards", query.get("shards", []))
        for shard in shards or ():
            if _SHARD.fullmatch(shard) is None:
                raise FeedQueryError(f"shards: {shown(shard)} is not a shard id ({SHARD_ID_PATTERN})")
        kinds = _values("kinds", query.get("kinds", []))
        for kind in kinds or ():
            if len(kind) > 128 or _KIND_FILTER.fullmatch(kind) is None:
                raise FeedQueryError(f"kinds: {shown(kind)} is not a frame kind (dotted tokens of "
                                     "A-Za-z0-9_-, * for one token, a final > for the rest)")
        board_names = _values("boards", query.get("boards", []))
        for board in board_names or ():
            if _BOARD.fullmatch(board) is None or board not in known:
                raise FeedQueryError(f"boards: {shown(board)} is no board; boards: {', '.join(sorted(known))}")
        types = _values("types", query.get("types", []))
        for kind_of_event in types or ():
            if kind_of_event not in TYPES:
                raise FeedQueryError(f"types: {shown(kind_of_event)} is no event type; types: {', '.join(TYPES)}")
        if types is None:
            implied = {"frame"} if kinds else set()
            implied |= {"board"} if board_names else set()
            types = sorted(implied) or list(TYPES)
        if kinds and "frame" not in types:
            raise FeedQueryError("kinds: narrows frames, but types leaves frames out")
        if board_names and "board" not in types:
            raise FeedQueryError("boards: narrows boards, but types leaves boards out")
        return cls(frozenset(types), frozenset(shards) if shards else None,
                   tuple(kinds) if kinds else None, frozenset(board_names) if board_names else None)

    def describe(self) -> dict[str, list[str] | None]:
        """The filter as JSON (the feed's hello echoes it)."""
        return {"types": [t for t in TYPES if t in self.types],
                "shards": sorted(self.shards) if self.shards else None,
                "kinds": list(self.kinds) if self.kinds else None,
                "boards": sorted(self.boards) if self.boards else None}

    # --- matching (the authority) --------------------------------------------------------

    def matches(self, type_: str, shard: str | None, kind: str | None, board: str | None) -> bool:
        """Does an event with these fields pass? (``shard`` of a ledger event: its run's shard.)"""
        if type_ not in self.types:
            return False
        if self.shards is not None and shard not in self.shards:
            return False
        if type_ == "frame" and self.kinds is not None:
            return kind is not None and any(subject_matches(p, kind) for p in self.kinds)
        if type_ == "board" and self.boards is not None:
            return board in self.boards
        return True

    # --- what NATS can filter --------------------------------------------------------------

    def subjects(self, bucket_of: dict[str, str], ledger_wildcard: str) -> list[str]:
        """Every subject pattern this filter wants from the feed stream (``bucket_of``: board →
        its bucket). Ledger events are filtered by shard here, not by NATS (the shard is in
        the payload)."""
        shard_tokens = sorted(self.shards) if self.shards else ["*"]
        found: list[str] = []
        if "frame" in self.types:
            found += [f"shard.{s}.frame.{k}" for s in shard_tokens for k in (self.kinds or (">",))]
        if "board" in self.types:
            for board in sorted(self.boards or bucket_of):
                bucket = bucket_of[board]
                found += [f"$KV.{bucket}.>"] if not self.shards else [f"$KV.{bucket}.{s}.>" for s in shard_tokens]
        if "ledger" in self.types:
            found.append(ledger_wildcard)
        return found


def consumer_filters(wanted: list[str], many: bool) -> list[str]:
    """The filter subjects of a consumer delivering at least ``wanted``: all of them when the
    server takes several (NATS 2.10+, ``many``) and none overlaps (the server refuses overlaps),
    else the narrowest single subject covering them all; ``[]`` is no filter."""
    if len(wanted) == 1:
        return wanted
    if many and len(wanted) <= MAX_FILTER_SUBJECTS and not any(
            overlap(a, b) for i, a in enumerate(wanted) for b in wanted[i + 1:]):
        return wanted
    cover = covering(wanted)
    return [] if cover == ">" else [cover]


def subject_matches(pattern: str, subject: str) -> bool:
    """NATS matching of a concrete ``subject`` against ``pattern`` (``*``: one token, ``>``: the rest)."""
    p, s = pattern.split("."), subject.split(".")
    for i, token in enumerate(p):
        if token == ">":
            return len(s) > i
        if i >= len(s) or (token != "*" and token != s[i]):
            return False
    return len(p) == len(s)


def overlap(a: str, b: str) -> bool:
    """Could one subject match both patterns?"""
    x, y = a.split("."), b.split(".")
    for i in range(min(len(x), len(y))):
        if x[i] == ">" or y[i] == ">":
            return True
        if x[i] != y[i] and "*" not in (x[i], y[i]):
            return False
    return len(x) == len(y)


def covering(patterns: list[str]) -> str:
    """One pattern matching every subject any of ``patterns`` matches (maybe more)."""
    split = [p.split(".") for p in patterns]
    shortest = min(len(tokens) for tokens in split)
    same_length = all(len(tokens) == shortest for tokens in split)
    cover: list[str] = []
    for i in range(shortest):
        column = {tokens[i] for tokens in split}
        if ">" in column or (not same_length and i == shortest - 1):
            return ".".join([*cover, ">"])
        cover.append(column.pop() if len(column) == 1 else "*")
    return ".".join(cover)
