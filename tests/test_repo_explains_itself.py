"""The repository explains itself: nothing in it cites a document it does not hold.

shardbus comes from design documents kept outside this repository: the team's product
specification and two seeds (the shard sidecar's protocol 7, the website core). Code, tests and
docs used to cite them (``SPEC section 2``, ``S004:295-298``, ``S000:176``), which a reader of the
repository alone cannot follow. Every rule they cited is stated in docs/ and cited there, as
``docs/gateway.md, "Boards"`` (a page and one of its headings) or ``docs/gateway.md#boards``.

The first test fails on such a citation in any .py or .md file, or in the generated API documents
(:data:`GENERATED`: ``docs/openapi/*.json``, ``docs/asyncapi/*.json``, made from the code's
docstrings and summaries), except:

- the shard simulator's quote files (:data:`QUOTE_FILES`), which hold the seed's frames, bodies
  and sentences as data, each with its line in the seed (``S004:NNN``);
- the conformance tests that compare those quotes with the seed (:data:`SEED_COMPARISONS`), where
  a line number is data (their comments point into docs/ like everything else);
- :data:`PENDING`: files another engineer was changing while this was written (issue 40,
  item 5), whose references were listed for that engineer rather than edited under them. Take a
  file off the list once its references are gone.

In the first two, a citation of the specification still fails: they quote only the seed.

The second test fails on a ``docs/<page>.md, "<heading>"`` or ``docs/<page>.md#<anchor>``
citation whose page does not exist, or whose heading (or anchor) the page has not — a quoted
term the page uses will do too (``docs/cleanup.md, "deferred"``) — so the citations that replaced
the old ones keep leading somewhere.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

OUTSIDE = re.compile(r"\bSPEC\b|\bS00[04]\b")
"""A citation of the product specification (``SPEC``) or of a seed (``S004``, ``S000``)."""

SPECIFICATION = re.compile(r"\bSPEC\b")
"""The specification's part of :data:`OUTSIDE`, which the simulator and its comparisons do not quote."""

QUOTE_FILES = frozenset({"simulator/seed_wire.py", "simulator/world.py", "simulator/shard.py"})
"""The simulator's quotes of the seed, kept as data with their lines."""

SEED_COMPARISONS = ("tests/conformance/", "tests/gateway/test_shard_simulator.py")
"""The tests that check the simulator's quotes against the seed (a file, or a folder ending in /)."""

PENDING: frozenset[str] = frozenset()
"""Files (or folders ending in /) being changed on another branch when this test was written."""

THIS = "tests/test_repo_explains_itself.py"
"""This file, which names the patterns it looks for."""

SKIPPED_DIRS = frozenset({".git", ".venv", "node_modules", "__pycache__"})

CITATION = re.compile(r'docs/((?:[A-Za-z0-9_-]+/)*[A-Za-z0-9_.-]+\.md)(?:#([a-z0-9_-]+)|, "([^"\n]+)")')
"""``docs/<page>.md#<anchor>`` or ``docs/<page>.md, "<heading>"``."""

PAGE_NAME = r"(?:[A-Za-z0-9_-]+/)*[A-Za-z0-9_-]+(?:\.[A-Za-z0-9_-]+)*\.md"
"""A page under docs/ as a citation may name it (no ``..``: the page is opened as a path)."""


GENERATED = ("docs/openapi/*.json", "docs/asyncapi/*.json")
"""The API documents ``make docs`` generates: they carry the code's words to a reader too."""


def _generated() -> list[Path]:
    """Every generated API document (:data:`GENERATED`)."""
    return sorted(path for pattern in GENERATED for path in ROOT.glob(pattern))


def _sources() -> list[Path]:
    """Every .py and .md file of the repository, outside virtual environments and state folders."""
    found = []
    for path in sorted(ROOT.rglob("*")):
        parts = path.relative_to(ROOT).parts
        if path.suffix in (".py", ".md") and path.is_file() and not any(
                part in SKIPPED_DIRS or part.startswith(".") for part in parts[:-1]):
            found.append(path)
    return found


def _listed(relative: str, entries: frozenset[str] | tuple[str, ...]) -> bool:
    return any(relative == entry or (entry.endswith("/") and relative.startswith(entry)) for entry in entries)


def _anchor(heading: str) -> str:
    """A heading's anchor as GitHub makes it: lower case, punctuation dropped, spaces → ``-``."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def _headings(page: Path) -> list[str]:
    """A markdown page's headings, without ``#`` marks or code fences' contents."""
    headings, fenced = [], False
    for line in page.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and (match := re.fullmatch(r"#{1,6} (.+)", line)):
            headings.append(match.group(1).strip())
    return headings


def test_no_citation_of_a_document_the_repository_does_not_hold() -> None:
    found = []
    generated = _generated()
    assert generated, f"no generated API documents match {GENERATED}: are they still there?"
    for path in _sources() + generated:
        relative = path.relative_to(ROOT).as_posix()
        if relative == THIS or _listed(relative, PENDING):
            continue
        quotes = relative in QUOTE_FILES or _listed(relative, SEED_COMPARISONS)
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if (SPECIFICATION if quotes else OUTSIDE).search(line):
                found.append(f"{relative}:{number}: {line.strip()[:120]}")
    assert not found, ("cite docs/ (stating the rule there if it is missing), not the specification or a "
                       "seed the repository does not hold:\n" + "\n".join(found))


def test_every_citation_of_docs_names_a_page_and_a_heading_that_exist() -> None:
    broken, seen = [], 0
    for path in _sources():
        relative = path.relative_to(ROOT).as_posix()
        text = path.read_text(encoding="utf-8")
        for match in CITATION.finditer(text):
            seen += 1
            name, anchor, heading = match.group(1), match.group(2), match.group(3)
            where = f"{relative}:{text.count(chr(10), 0, match.start()) + 1}: {match.group(0)}"
            page = ROOT / "docs" / name
            if not re.fullmatch(PAGE_NAME, name) or not page.is_file():
                broken.append(f"{where} (no such page)")
                continue
            headings = _headings(page)
            if anchor is not None and anchor not in {_anchor(h) for h in headings}:
                broken.append(f"{where} (no heading with that anchor)")
            elif heading is not None and not (any(h.lower().startswith(heading.lower()) for h in headings)
                                              or heading.lower() in page.read_text(encoding="utf-8").lower()):
                broken.append(f"{where} (no heading, nor anything on the page, says that)")
    assert seen > 50, f"only {seen} citations of docs/ found: is the pattern still right?"
    assert not broken, "citations of docs/ that lead nowhere:\n" + "\n".join(broken)
