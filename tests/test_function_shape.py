"""Functions short enough to read in one go (docs/architecture.md, "Layout"): none over
:data:`MAX_LINES` lines or with blocks nested deeper than :data:`MAX_DEPTH` unless a ``# shape:``
comment inside it says why it is better whole."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("services", "shared", "shardbus", "simulator")
MAX_LINES = 60
MAX_DEPTH = 4
BLOCKS = (ast.If, ast.For, ast.AsyncFor, ast.While, ast.With, ast.AsyncWith, ast.Try, ast.Match)


def nesting(statements: list[ast.stmt], depth: int = 0) -> int:
    """How deep blocks nest in ``statements`` (an ``elif`` is its ``if``'s level; a function or
    class defined inside is measured on its own)."""
    deepest = depth
    for statement in statements:
        if isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue
        if not isinstance(statement, BLOCKS):
            continue
        inner = depth + 1
        bodies: list[list[ast.stmt]] = []
        if isinstance(statement, ast.If):
            bodies.append(statement.body)
            orelse = statement.orelse
            if len(orelse) == 1 and isinstance(orelse[0], ast.If):
                deepest = max(deepest, nesting(orelse, depth))  # elif: the same level
            else:
                bodies.append(orelse)
        elif isinstance(statement, ast.Try):
            bodies += [statement.body, statement.orelse, statement.finalbody]
            bodies += [handler.body for handler in statement.handlers]
        elif isinstance(statement, ast.Match):
            bodies += [case.body for case in statement.cases]
        else:
            bodies += [statement.body, getattr(statement, "orelse", [])]
        for body in bodies:
            deepest = max(deepest, inner, nesting(body, inner))
    return deepest


def unexplained(path: Path, root: Path = ROOT) -> list[str]:
    source = path.read_text(encoding="utf-8")
    lines = source.splitlines()
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        assert node.end_lineno is not None
        length, depth = node.end_lineno - node.lineno + 1, nesting(node.body)
        if length <= MAX_LINES and depth <= MAX_DEPTH:
            continue
        if any("# shape:" in line for line in lines[node.lineno - 1:node.end_lineno]):
            continue
        found.append(f"{path.relative_to(root)}:{node.lineno} {node.name}: {length} lines, nested {depth} deep")
    return found


def test_no_long_or_deep_function_without_a_reason():
    found = [line for package in PACKAGES for path in sorted((ROOT / package).rglob("*.py"))
             if "migrations" not in path.parts for line in unexplained(path)]
    assert found == [], "split these, or say why in a '# shape:' comment:\n" + "\n".join(found)


def test_the_measure_counts_blocks_not_elifs(tmp_path):
    flat = "def f(x):\n    if x == 1:\n        pass\n    elif x == 2:\n        pass\n    elif x == 3:\n        pass\n"
    deep = "def g(x):\n" + "".join("    " * (i + 1) + f"if x > {i}:\n" for i in range(5)) + "    " * 6 + "pass\n"
    long = "def h():\n" + "    x = 1\n" * 61
    (tmp_path / "m.py").write_text(flat + deep + long)
    assert nesting(ast.parse(flat).body[0].body) == 1  # type: ignore[attr-defined]
    assert [line.split(" ")[1] for line in unexplained(tmp_path / "m.py", tmp_path)] == ["g:", "h:"]
