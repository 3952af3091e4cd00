"""Every failure shardbus names derives from one root, ``shared.errors.ShardbusError``, with the
status of the reply it becomes and the sentence a person acts on (docs/adr/0010). A private
exception (``_Name``) that never leaves its module is exempt."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

from shared.errors import ShardbusError

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("services", "shared", "shardbus")


def named_exceptions() -> list[tuple[str, str]]:
    """(module, class) of every public class in the packages whose bases name an exception."""
    found = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            if "migrations" in path.parts:
                continue
            module = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
            for node in ast.parse(path.read_text(encoding="utf-8")).body:
                if isinstance(node, ast.ClassDef) and not node.name.startswith("_") and node.bases:
                    found.append((module, node.name))
    return found


def test_every_named_failure_derives_from_the_one_root():
    outside = []
    checked = 0
    for module, name in named_exceptions():
        cls = getattr(importlib.import_module(module), name)
        if isinstance(cls, type) and issubclass(cls, BaseException):
            checked += 1
            if not issubclass(cls, ShardbusError):
                outside.append(f"{module}.{name}")
    assert checked >= 25
    assert outside == [], f"exceptions outside shared.errors.ShardbusError: {outside}"

