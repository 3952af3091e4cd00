"""The console's boards of one shard (``shard.<shard>.board.<name>``, any gateway replica): the
guilds with their rosters — "no roster yet" (no ``roster`` key) is not an empty roster — the
market, houses, champions, news, and the seed's ruleset, points and governor boards, which the
gateway does not keep yet (it answers 404: the page says so)."""

from __future__ import annotations

import asyncio
import json
from http import HTTPStatus
from typing import Any

from fastapi import Request

from services.web.console.reads import ask
from shared import subjects

BOARDS = ("guilds", "market", "houses", "champions", "news", "ruleset", "points", "governor")
"""The boards shown, in order."""

ROSTER_SHOWN = 100
"""Roster members listed per guild (the rest are counted)."""

ITEMS_SHOWN = 200
"""Items listed per board (the rest are counted)."""

SUMMARY_CHARS = 200


def _text(value: Any) -> str:
    if value is None:
        return ""
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def summary(item: dict[str, Any]) -> str:
    """An item's fields other than its name, compact and cut."""
    rest = {k: v for k, v in item.items() if k not in ("t", "kind", "id", "serial", "name", "title", "roster")}
    text = json.dumps(rest, ensure_ascii=False, separators=(", ", ": "), sort_keys=True) if rest else ""
    return text if len(text) <= SUMMARY_CHARS else text[:SUMMARY_CHARS] + "…"


def guild(item: dict[str, Any]) -> dict[str, Any]:
    """A guild as shown: ``roster`` is None when no roster has arrived (unknown), a list when
    one has (possibly empty)."""
    roster = item.get("roster") if "roster" in item else None
    members = [m for m in roster if isinstance(m, dict)] if isinstance(roster, list) else None
    names = [_text(m.get("name")) or _text(m.get("serial")) or "?" for m in (members or [])[:ROSTER_SHOWN]]
    return {"id": _text(item.get("id")), "name": _text(item.get("name")) or "(no guild.update yet)",
            "abbr": _text(item.get("abbr")), "members": _text(item.get("members")),
            "online": _text(item.get("online")), "roster": names if members is not None else None,
            "rosterCount": len(members) if members is not None else 0,
            "rosterMore": max(0, len(members) - ROSTER_SHOWN) if members is not None else 0}


def generic(item: dict[str, Any]) -> dict[str, Any]:
    return {"id": _text(item.get("serial", item.get("id"))), "name": _text(item.get("name", item.get("title"))),
            "summary": summary(item)}


async def read(request: Request, shard: str, board: str) -> dict[str, Any]:
    """One board: its items as shown, or why it cannot be shown."""
    answer = await ask(request, subjects.board(shard, board), {}, "gateway")
    if answer.status == HTTPStatus.NOT_FOUND:
        return {"board": board, "missing": answer.reply.get("error") or "no such board", "items": []}
    if not answer.ok:
        return {"board": board, "error": answer.error, "items": []}
    items = [i for i in answer.reply.get("items") or [] if isinstance(i, dict)]
    shape = guild if board == "guilds" else generic
    return {"board": board, "items": [shape(i) for i in items[:ITEMS_SHOWN]],
            "more": max(0, len(items) - ITEMS_SHOWN), "count": len(items)}


async def read_all(request: Request, shard: str) -> list[dict[str, Any]]:
    return list(await asyncio.gather(*(read(request, shard, board) for board in BOARDS)))
