"""Every ``SHARDBUS_*`` name the documentation or a console page writes is one the code reads,
and every variable the code reads is documented: the services' settings in the README's table
(exactly as ``make docs`` writes it), the commands' and the suite's own variables somewhere in
README.md or docs/.

An operator follows the words: docs/console.md once named ``SHARDBUS_INSTALLER_MODULES`` (the
module page showed it too) where the installer reads ``SHARDBUS_DECLARED_MODULES``, so the
variable an operator set was read by nothing (issue 38)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from shardbus import stack
from shardbus.settings_catalog import END, START, all_settings, markdown_table

ROOT = Path(__file__).resolve().parents[1]
HERE = Path(__file__).resolve()

WRITTEN = re.compile(r"(?<![A-Za-z0-9_$])SHARDBUS_[A-Z0-9_]*(?:[A-Z0-9]|_(?=[<{…*]|\.\.\.))")
"""A name as prose writes it: whole (``SHARDBUS_WEB_TOKEN``), or a family ending in ``_``
before ``…``, ``*``, ``<NAME>`` or ``{name}`` (``SHARDBUS_WEB_…``). Not a part of another word
(the bucket ``KV_SHARDBUS_INSTALLER``)."""

DOCUMENT_SUFFIXES = {".md", ".json", ".yaml", ".yml", ".txt"}
PAGE_SUFFIXES = {".html", ".js", ".py"}
CODE_DIRS = ("shardbus", "services", "shared", "simulator", "tests", "bench")


def _documents() -> list[Path]:
    return sorted(p for p in (ROOT / "docs").rglob("*") if p.is_file() and p.suffix in DOCUMENT_SUFFIXES)


def _pages() -> list[Path]:
    """The console's templates, scripts and the modules that write its pages."""
    return sorted(p for p in (ROOT / "services/web/console").rglob("*") if p.is_file() and p.suffix in PAGE_SUFFIXES)


def _written(paths: list[Path]) -> dict[str, set[str]]:
    found: dict[str, set[str]] = {}
    for path in paths:
        for match in WRITTEN.finditer(path.read_text(errors="replace")):
            found.setdefault(match.group(), set()).add(str(path.relative_to(ROOT)))
    return found


def _named_in_code() -> set[str]:
    """Every ``SHARDBUS_*`` string constant of the code (``os.environ.get("SHARDBUS_STATE_DIR")``,
    ``WAIT_NOTICE_VARIABLE = "SHARDBUS_UP_WAIT_NOTICE_S"``): read or set, never a comment or
    sentence. This file is left out: it names the wrong one on purpose."""
    names: set[str] = set()
    for folder in CODE_DIRS:
        for path in (ROOT / folder).rglob("*.py"):
            if path.resolve() == HERE:
                continue
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if (isinstance(node, ast.Constant) and isinstance(node.value, str)
                        and re.fullmatch(r"SHARDBUS_[A-Z0-9_]+", node.value)):
                    names.add(node.value)
    return names


def _values() -> set[str]:
    """Settings' default values that look like names (the lock bucket ``SHARDBUS_INSTALLER``)."""
    return {str(default) for entries in all_settings().values() for _who, default, _d in entries}


def read_by_code() -> set[str]:
    """What the code reads: every service's settings, ``shardbus up``'s ports
    (``SHARDBUS_<NAME>_PORT``, built from its table) and every name the code spells out."""
    ports = {f"SHARDBUS_{name}" for name, _what in stack.PORTS.values()}
    return (set(all_settings()) | ports | _named_in_code()) - _values()


def test_every_name_the_docs_and_pages_write_is_read_by_the_code():
    read = read_by_code()
    values = _values()
    unread = {}
    for name, where in _written(_documents() + _pages()).items():
        family = name.endswith("_")
        if name in values or (name in read if not family else any(r.startswith(name) for r in read)):
            continue
        unread[name] = sorted(where)
    assert unread == {}, "named in the docs or a page, read by no code"


def test_the_readme_table_is_every_services_setting_as_make_docs_writes_it():
    readme = (ROOT / "README.md").read_text()
    assert START in readme and END in readme
    table = readme.split(START, 1)[1].split(END, 1)[0].strip()
    assert table == markdown_table(), "run `make docs`"
    rows = {line.split("|")[1].strip().strip("`") for line in table.splitlines()[2:]}
    assert rows == set(all_settings())


def test_every_variable_read_outside_the_settings_is_documented():
    documented = set(_written([ROOT / "README.md", *_documents()]))
    undocumented = sorted(read_by_code() - set(all_settings()) - documented)
    assert undocumented == [], "read by the code (commands, simulator, suite), written nowhere in README.md or docs/"


def test_the_check_sees_a_name_nothing_reads():
    # The check itself can fail: the name console.md once gave, and a family nothing reads.
    read = read_by_code()
    assert "SHARDBUS_DECLARED_MODULES" in read
    assert "SHARDBUS_INSTALLER_MODULES" not in read
    written = WRITTEN.findall("set `SHARDBUS_INSTALLER_MODULES`, or any SHARDBUS_WEB_… (KV_SHARDBUS_INSTALLER)")
    assert written == ["SHARDBUS_INSTALLER_MODULES", "SHARDBUS_WEB_"]
