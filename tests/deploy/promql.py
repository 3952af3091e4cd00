"""What a PromQL expression reads: the series it names and the labels it matches or groups
by. Enough of PromQL for the alerts and the dashboard (promtool checks their syntax; this
checks their names against tests/deploy/catalogue.py)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

KEYWORDS = frozenset({
    "by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or", "unless",
    "offset", "inf", "nan",
})
GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\(([^()]*)\)")
SELECTOR = re.compile(r"([A-Za-z_:][\w:]*)?\s*\{([^{}]*)\}")
MATCHER = re.compile(r"\s*([A-Za-z_]\w*)\s*(?:=~|!~|!=|=)\s*\"\"\s*")
STRING = re.compile(r'"(?:[^"\\]|\\.)*"')
RANGE = re.compile(r"\[[^\[\]]*\]")
IDENTIFIER = re.compile(r"(?<![\w:.$])([A-Za-z_:][\w:]*)(\s*\()?")
NUMBER_OR_DURATION = re.compile(r"\d+(?:\.\d+)?(?:e[+-]?\d+)?(?:ms|s|m|h|d|w|y)?", re.I)


@dataclass
class Reads:
    """The series an expression names, with the labels its selectors match on each, and
    the labels its ``by``/``on``/… clauses name."""

    series: dict[str, set[str]] = field(default_factory=dict)
    grouping: set[str] = field(default_factory=set)


def reads(expr: str) -> Reads:
    found = Reads()
    text = STRING.sub('""', expr)
    text = RANGE.sub("", text)
    for match in GROUPING.finditer(text):
        found.grouping |= {label.strip() for label in match.group(1).split(",") if label.strip()}
    text = GROUPING.sub(" ", text)

    def selector(match: re.Match[str]) -> str:
        name, body = match.group(1), match.group(2)
        labels = set()
        for part in filter(str.strip, body.split(",")):
            matcher = MATCHER.fullmatch(part)
            if not matcher:
                raise ValueError(f"cannot read the matcher {part!r} of {expr!r}")
            labels.add(matcher.group(1))
        if name is None:  # {__name__="…"} or a bare matcher: not used here
            raise ValueError(f"a selector without a series name in {expr!r}")
        found.series.setdefault(name, set()).update(labels)
        return " "

    text = SELECTOR.sub(selector, text)
    for match in IDENTIFIER.finditer(text):
        name, call = match.group(1), match.group(2)
        if call or name.lower() in KEYWORDS or NUMBER_OR_DURATION.fullmatch(name):
            continue
        found.series.setdefault(name, set())
    return found
