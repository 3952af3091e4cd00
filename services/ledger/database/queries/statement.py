"""How a ledger statement is made: :class:`Statement` (a named SQL text whose ``:name``
parameters are numbered ``$n`` once, at import) and :func:`compose` (SQL fragments put in by
name, never a value). Every family of ``services/ledger/database/queries/`` builds its statements here."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from string import Template
from textwrap import dedent
from typing import Any

_PARAM = re.compile(r"'(?:[^']|'')*'|(?<![:\w]):(\w+)")
"""A ``:name`` parameter (group 1), or a quoted constant, left as it is: a ``::type`` cast is
no parameter, nor is ``':x'`` inside a constant."""


def compose(text: str, **fragments: str) -> str:
    """``text`` with each ``$name`` (``string.Template`` syntax) replaced by ``fragments[name]``:
    SQL text made here at import, never a value (values are bound parameters). A fragment's
    later lines are indented to the line it lands on, so that a printed statement reads as one.
    A fragment holds no ``$`` of its own, so composing again never reads into one."""
    for name, fragment in fragments.items():
        if "$" in fragment:
            raise ValueError(f"fragment {name!r} holds a '$'")

    def put(match: re.Match[str]) -> str:
        name = match.group("named") or match.group("braced")
        if name is None:
            raise ValueError(f"a '$' that names no fragment at {match.start()} of {text!r}")
        if name not in fragments:
            raise KeyError(f"no fragment {name!r} given")
        line = text[text.rfind("\n", 0, match.start()) + 1:]
        return _indented(fragments[name], line[:len(line) - len(line.lstrip(" "))])

    return Template(text).pattern.sub(put, text)


def _indented(fragment: str, indent: str) -> str:
    """``fragment``'s first line, then the rest dedented and indented by ``indent``."""
    head, _, rest = fragment.partition("\n")
    if not rest:
        return head
    return head + "\n" + indent + dedent(rest).replace("\n", "\n" + indent)


@dataclass(frozen=True)
class Statement:
    """One named statement: ``text`` with ``:name`` parameters (as reviewed and printed), and
    ``sql``, the same with ``$n`` as asyncpg sends it, whose values :meth:`args` orders."""

    name: str
    doc: str
    text: str
    sql: str = field(init=False, repr=False)
    params: tuple[str, ...] = field(init=False)

    def __post_init__(self) -> None:
        names: list[str] = []

        def number(match: re.Match[str]) -> str:
            name = match.group(1)
            if name is None:
                return match.group(0)
            if name not in names:
                names.append(name)
            return "$" + str(names.index(name) + 1)

        object.__setattr__(self, "text", dedent(self.text).strip())
        object.__setattr__(self, "doc", " ".join(self.doc.split()))
        object.__setattr__(self, "sql", _PARAM.sub(number, self.text))
        object.__setattr__(self, "params", tuple(names))

    def args(self, values: Mapping[str, Any] | None = None) -> list[Any]:
        """The values of :attr:`params`, in order. A missing value, or one the statement does not
        take (a misspelt name, a parameter left behind), is a KeyError naming it."""
        given = values or {}
        if len(given) != len(self.params) or not all(name in given for name in self.params):
            missing = sorted(set(self.params) - set(given))
            unused = sorted(set(given) - set(self.params))
            raise KeyError(f"{self.name}: missing {missing}, not taken {unused}")
        return [given[name] for name in self.params]
