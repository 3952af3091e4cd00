"""No two of the project's modules import each other, directly or round a longer circle.

A circle works only as long as every import in it stays inside a function (or in the one order
Python happens to load them), and it hides which module owns a thing: ``shardbus.stack`` took
``STOP_TIMEOUT_S`` from ``shardbus.cli``, which imports ``stack``. Every ``import`` and ``from …
import`` statement counts, at module level or inside a function, read with :mod:`ast` (nothing is
imported); so are the modules ``shardbus/registry.py`` names, which ``shardbus.cli`` (each
service's app and commands) and ``shardbus.settings_catalog`` (its settings) load with
``importlib`` — ``services.cleanup.commands`` took ``quiet`` from ``shardbus.cli``, which loads it.

Nor do the arrows run upward: no module under ``services/`` or ``shared/`` imports the command-line
package ``shardbus/`` (docs/architecture.md, "Layout": services meet on subjects, and what they
share is in ``shared/``). The CLI loads each service's ``commands.py``; a ``commands.py`` that took
its NATS helpers back from ``shardbus/`` made the one arrow from a service up to the CLI (ADR 0010).

``python -m tests.test_import_cycles`` prints the circles, and the upward imports, it finds.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

PACKAGES = ("shardbus", "shared", "services", "simulator", "tests")
"""The project's packages (pyproject.toml, ``[tool.setuptools.packages.find]``) and its tests."""

BELOW_THE_CLI = ("services", "shared")
"""The packages that never import :data:`CLI` (nor, through the rules above, each other upward)."""

CLI = "shardbus"
"""The command-line package: it imports the services (their apps and commands), never the reverse."""

REGISTRY_LOADERS = {"shardbus.cli": ("app", "commands"), "shardbus.settings_catalog": ("settings",)}
"""Which modules import which of each registry entry's code (``shardbus.registry.Service``)."""


def project_modules(root: Path = ROOT) -> dict[str, Path]:
    """Every module of :data:`PACKAGES` by dotted name (a package by its own name)."""
    modules: dict[str, Path] = {}
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            modules[".".join(parts)] = path
    return modules


def _imported(module: str, is_package: bool, tree: ast.AST, modules: dict[str, Path]) -> set[str]:
    """The project modules ``tree`` (the source of ``module``) imports, by any statement."""
    found: set[str] = set()

    def add(name: str) -> None:
        while name and name not in modules:  # ``import a.b.attr`` / ``from a.b import attr``: a.b
            name = name.rpartition(".")[0]
        if name and name != module:
            found.add(name)

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(alias.name)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                package = module if is_package else module.rpartition(".")[0]
                for _ in range(node.level - 1):
                    package = package.rpartition(".")[0]
                base = ".".join(part for part in (package, node.module or "") if part)
            else:
                base = node.module or ""
            for alias in node.names:
                full = f"{base}.{alias.name}"
                add(full if full in modules else base)
    return found


def import_graph(root: Path = ROOT) -> dict[str, set[str]]:
    """Each project module and the project modules it imports."""
    modules = project_modules(root)
    graph = {name: _imported(name, path.name == "__init__.py", ast.parse(path.read_text(), str(path)), modules)
             for name, path in modules.items()}
    if root == ROOT:
        from shardbus import registry

        for loader, fields in REGISTRY_LOADERS.items():
            graph[loader] |= {path.partition(":")[0] for service in registry.SERVICES for field in fields
                              if (path := getattr(service, field))}
    return graph


def _reach(start: str, edges: dict[str, set[str]]) -> set[str]:
    """``start`` and every module it reaches along ``edges``."""
    seen, todo = {start}, [start]
    while todo:
        for target in edges.get(todo.pop(), ()):
            if target not in seen:
                seen.add(target)
                todo.append(target)
    return seen


def circle_groups(graph: dict[str, set[str]]) -> list[set[str]]:
    """Every group of modules that import one another round some circle (each module of a
    group reaches every other and is reached back), sorted by their first module."""
    reverse: dict[str, set[str]] = {}
    for source, targets in graph.items():
        for target in targets:
            reverse.setdefault(target, set()).add(source)
    groups: list[set[str]] = []
    grouped: set[str] = set()
    for module in sorted(graph):
        if module not in grouped:
            group = _reach(module, graph) & _reach(module, reverse)
            grouped |= group
            if len(group) > 1:
                groups.append(group)
    return groups


def circle_through(first: str, group: set[str], graph: dict[str, set[str]]) -> list[str]:
    """A shortest circle from ``first`` back to it inside ``group`` (``[a, b, a]``)."""
    paths = {first: [first]}
    frontier = [first]
    while frontier:
        following = []
        for node in frontier:
            for target in sorted(graph[node] & group):
                if target == first:
                    return [*paths[node], first]
                if target not in paths:
                    paths[target] = [*paths[node], target]
                    following.append(target)
        frontier = following
    raise ValueError(f"{first} is in no circle inside {sorted(group)}")


def describe(groups: list[set[str]], graph: dict[str, set[str]]) -> str:
    """A shortest circle through each module of each group, one a line."""
    return "\n".join(" -> ".join(circle_through(module, group, graph))
                     for group in groups for module in sorted(group))


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    """Every ``module -> imported`` arrow from a module of :data:`BELOW_THE_CLI` to one of :data:`CLI`."""
    return sorted(f"{module} -> {target}" for module, targets in graph.items()
                  if module.partition(".")[0] in BELOW_THE_CLI
                  for target in targets if target.partition(".")[0] == CLI)


def test_the_check_sees_a_circle_and_its_absence(tmp_path):
    """The check itself: a circle of three modules (module-level, in-function and relative
    imports) is found, one broken link clears it."""
    package = tmp_path / "shardbus"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("from shardbus import b\n")
    (package / "b.py").write_text("def f():\n    from .c import X\n    return X\n")
    (package / "c.py").write_text("import shardbus.a\nX = 1\n")
    graph = import_graph(tmp_path)
    assert circle_groups(graph) == [{"shardbus.a", "shardbus.b", "shardbus.c"}]
    assert circle_through("shardbus.b", circle_groups(graph)[0], graph) == [
        "shardbus.b", "shardbus.c", "shardbus.a", "shardbus.b"]
    (package / "c.py").write_text("X = 1\n")
    assert circle_groups(import_graph(tmp_path)) == []


def test_no_module_of_the_project_is_in_an_import_circle():
    graph = import_graph()
    groups = circle_groups(graph)
    assert not groups, "import circles (put what both sides need in a module of its own):\n" + describe(groups, graph)


def test_the_check_sees_a_service_importing_the_command_line_package(tmp_path):
    """The check itself: an import of ``shardbus`` inside a function of a service, or at module
    level in ``shared``, is found; the CLI importing a service is not."""
    for package in ("shardbus", "services", "services/cleanup", "shared"):
        (tmp_path / package).mkdir()
        (tmp_path / package / "__init__.py").write_text("")
    (tmp_path / "shardbus" / "helpers.py").write_text("X = 1\n")
    (tmp_path / "shardbus" / "cli.py").write_text("from services.cleanup import commands\n")
    (tmp_path / "services" / "cleanup" / "commands.py").write_text("def f():\n    from shardbus.helpers import X\n")
    (tmp_path / "shared" / "calls.py").write_text("import shardbus.helpers\n")
    assert upward_imports(import_graph(tmp_path)) == ["services.cleanup.commands -> shardbus.helpers",
                                                      "shared.calls -> shardbus.helpers"]
    (tmp_path / "services" / "cleanup" / "commands.py").write_text("X = 1\n")
    (tmp_path / "shared" / "calls.py").write_text("X = 1\n")
    assert upward_imports(import_graph(tmp_path)) == []


def test_no_service_and_nothing_shared_imports_the_command_line_package():
    arrows = upward_imports(import_graph())
    assert not arrows, ("imports of the command-line package from below it (put what both need in shared/):\n"
                        + "\n".join(arrows))


if __name__ == "__main__":
    graph = import_graph()
    groups = circle_groups(graph)
    arrows = upward_imports(graph)
    print(describe(groups, graph) if groups else "no import circle")
    print("\n".join(arrows) if arrows else "no import of shardbus from services/ or shared/")
    sys.exit(1 if groups or arrows else 0)
