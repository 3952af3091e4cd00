"""Fixtures every test shares: a real nats-server and a real PostgreSQL, started once per
test session on free ports (or the ones named by ``SHARDBUS_TEST_NATS_URL`` and
``SHARDBUS_TEST_DATABASE_URL``), a fresh database per test (empty, or a copy of a database
migrated once per session), and service processes.

No mock stands in for NATS or PostgreSQL. Every process started here is stopped here, by
its own handle; the servers also die with the test run if it is killed (PDEATHSIG).

Every test is also given one cost marker here (docs/architecture.md, "The test suite"):
``faults`` (tests/faults), ``hosts`` (tests/hosts: network namespaces, root), ``system`` (starts
service processes, ``shardbus`` commands or the stack; and tests/deploy: promtool, compose, a
container engine), ``integration`` (talks to a real server, starts no process of ours) or
``unit`` (neither), from its folder, the fixtures it requests, and what its code calls (read
with :mod:`ast`: a comment or a string does not count). A guard fails a test that starts more
than its marker says, and one whose marker came from what it calls that did not start it.
"""

from __future__ import annotations

import ast
import asyncio
import inspect
import os
import shutil
import signal
import sys
import tempfile
import textwrap
import uuid
from collections.abc import AsyncIterator, Iterator
from concurrent.futures import ThreadPoolExecutor
from functools import cache
from pathlib import Path
from typing import Any

import asyncpg
import nats
import pytest

from services.ledger.database import migrate
from services.ledger.database.engine import normalise_url
from shardbus import embedded
from tests.processes import ServiceProcesses

# --- cost markers ----------------------------------------------------------------------------

COST_MARKERS = ("unit", "integration", "system", "faults", "hosts")

SERVER_FIXTURES = frozenset({"nats_url", "postgres_admin_url", "database_url", "migrated_database_url",
                             "ledger_template"})
"""Fixtures that are (or start) a real server; every fixture using one has it in its closure."""

PROCESS_FIXTURES = frozenset({"services"})
"""Fixtures that start service processes."""

PROCESS_STARTERS = frozenset({"ServiceProcesses"})
"""Callables of ours that start service processes (tests/processes.py)."""

SUBPROCESS_CALLS = frozenset({"run", "Popen", "check_call", "check_output", "call", "create_subprocess_exec"})
"""``subprocess``/``asyncio`` calls: with ``sys.executable`` among their arguments they start a
Python process of ours (``python -m shardbus …``, a service, a ``-c`` script)."""

SERVER_STARTERS = frozenset({"start_nats", "start_nats_cluster", "start_postgres"})
"""``shardbus.embedded`` calls that start a server of the test's own (a nats-server, a PostgreSQL)."""

TESTS = Path(__file__).resolve().parent

FOLDER_COSTS = {"faults": "faults", "hosts": "hosts", "system": "system", "deploy": "system"}
"""Folders of tests/ whose every test has one cost (tests/deploy: promtool, compose and a
container engine). Read below tests/ only: a checkout in a folder named ``system`` or
``deploy`` marks nothing."""


@cache
def _module_functions(path: str) -> dict[str, ast.AST]:
    """Top-level functions and classes of a test module or conftest, by name."""
    try:
        tree = ast.parse(Path(path).read_text())
    except (OSError, SyntaxError, ValueError):
        return {}
    return {node.name: node for node in tree.body
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)}


def _names(node: ast.AST) -> set[str]:
    """Every name and attribute name ``node`` refers to."""
    found: set[str] = set()
    for sub in ast.walk(node):
        if isinstance(sub, ast.Name):
            found.add(sub.id)
        elif isinstance(sub, ast.Attribute):
            found.add(sub.attr)
    return found


@cache
def _reached_code(func: Any) -> tuple[ast.AST, ...]:
    """The code of ``func`` and of every top-level function or class of its module that it
    uses, directly or through another one."""
    func = inspect.unwrap(func)
    try:
        path = inspect.getsourcefile(func)
        tree = ast.parse(textwrap.dedent(inspect.getsource(func)))
    except (OSError, TypeError, SyntaxError):
        return ()
    if path is None:
        return (tree,)
    helpers = _module_functions(path)
    reached: list[ast.AST] = [tree]
    todo = list(_names(tree))
    seen: set[str] = {getattr(func, "__name__", "")}
    while todo:
        name = todo.pop()
        if name in seen or name not in helpers:
            continue
        seen.add(name)
        reached.append(helpers[name])
        todo.extend(_names(helpers[name]))
    return tuple(reached)


def _called(node: ast.Call) -> str:
    """The name a call calls: ``f`` of ``f(…)`` and of ``a.b.f(…)``."""
    if isinstance(node.func, ast.Name):
        return node.func.id
    return node.func.attr if isinstance(node.func, ast.Attribute) else ""


def _is_sys_executable(node: ast.AST) -> bool:
    return isinstance(node, ast.Attribute) and node.attr == "executable" and isinstance(node.value, ast.Name) \
        and node.value.id == "sys"


def _calls(code: tuple[ast.AST, ...]) -> tuple[bool, bool]:
    """(whether ``code`` calls something that starts a process of ours, whether it calls
    something that starts a server): calls only — a comment, a docstring or a string naming
    ``sys.executable`` or ``start_nats`` does not count."""
    spawns = starts_server = False
    for tree in code:
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            name = _called(node)
            if name in PROCESS_STARTERS or (name in SUBPROCESS_CALLS and any(
                    _is_sys_executable(sub) for arg in (*node.args, *(kw.value for kw in node.keywords))
                    for sub in ast.walk(arg))):
                spawns = True
            elif name in SERVER_STARTERS:
                starts_server = True
    return spawns, starts_server


COST_REASON = pytest.StashKey[str]()
"""Why :func:`cost_of` chose the marker: ``path``, ``fixture``, ``calls`` (the guard checks them
out), ``wider fixture's calls`` or ``none`` (unit)."""


def cost_of(item: pytest.Item) -> tuple[str, str]:
    """The cost marker of ``item`` and why (see the module's docstring): its folder, else the
    fixtures it requests (their whole closure), else what its code, its same-module helpers and
    the project's fixtures it uses call."""
    path = Path(str(item.path)).resolve()
    folder = path.relative_to(TESTS).parts[0] if path.is_relative_to(TESTS) else ""
    if folder in FOLDER_COSTS:
        return FOLDER_COSTS[folder], "path"
    names = set(getattr(item, "fixturenames", ()))
    if names & PROCESS_FIXTURES:
        return "system", "fixture"
    # The test's own calls, and those of its function-scoped fixtures, happen while it runs (the
    # guard sees them); a wider fixture's may have happened for an earlier test.
    own = list(_reached_code(item.obj)) if hasattr(item, "obj") else []
    wider: list[ast.AST] = []
    info = getattr(item, "_fixtureinfo", None)
    for defs in (info.name2fixturedefs.values() if info else ()):
        for fixturedef in defs:  # the project's fixtures (not pytest's, not the guard below)
            if fixturedef.func.__module__.startswith("tests.") and fixturedef.argname != "_cost_marker_guard":
                (own if fixturedef.scope == "function" else wider).extend(_reached_code(fixturedef.func))
    own_spawns, own_server = _calls(tuple(own))
    wider_spawns, wider_server = _calls(tuple(wider))
    if own_spawns or wider_spawns:
        return "system", "calls" if own_spawns else "wider fixture's calls"
    if names & SERVER_FIXTURES:
        return "integration", "fixture"
    if own_server or wider_server:
        return "integration", "calls" if own_server else "wider fixture's calls"
    return "unit", "none"


STACK_GROUP = "whole-stack"
"""The pytest-xdist group of every test module that runs ``shardbus up`` (tests/system/up_process.py):
a whole stack is a nats-server, a PostgreSQL and up to a dozen service processes, and two of them
starting and stopping at once on two cores overran their stop's 30 s (seen). One worker runs
them one after another while the others take the rest."""


@cache
def _starts_stacks(path: str) -> bool:
    try:
        return "up_process" in Path(path).read_text()
    except OSError:
        return False


# tryfirst: the groups must be on the items before pytest-xdist reads them (its own hook).
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Give every test its cost marker (a test marked by hand keeps its own), and its
    pytest-xdist group (``make test --dist loadgroup``): its file, so a module's fixtures are
    set up once, or :data:`STACK_GROUP`."""
    for item in items:
        if not any(item.get_closest_marker(name) for name in COST_MARKERS):
            marker, item.stash[COST_REASON] = cost_of(item)
            item.add_marker(marker)
        path = str(item.path)
        item.add_marker(pytest.mark.xdist_group(STACK_GROUP if _starts_stacks(path) else path))


# The guard: a process started during a test (set-up and tear-down included) is seen through
# Python's audit hook for subprocess.Popen (asyncio's subprocesses go through it too). A `unit`
# test may start none, an `integration` test no Python process (a service, `shardbus …`). And a
# marker chosen for what a test's code calls must be borne out when the test passes: `system`
# started a Python process of ours, `integration` a server.
_spawned: list[list[str]] | None = None

CALL_PASSED = pytest.StashKey[bool]()
"""Whether the test's own call (not its set-up or tear-down) passed."""


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    report = yield
    if report.when == "call":
        item.stash[CALL_PASSED] = report.passed
    return report


def _audit(event: str, args: tuple[Any, ...]) -> None:
    if event == "subprocess.Popen" and _spawned is not None:
        argv = args[1]
        _spawned.append([os.fsdecode(a) for a in argv] if isinstance(argv, list | tuple) else [os.fsdecode(argv)])


def pytest_configure(config: pytest.Config) -> None:
    sys.addaudithook(_audit)


def _ours(argv: list[str]) -> bool:
    """Whether ``argv`` starts a Python program (a service, a ``shardbus`` command, a script)."""
    program = Path(argv[0]).name if argv else ""
    return program.startswith("python") or argv[0] == sys.executable or program in {"shardbus", "faststream"}


@pytest.fixture(autouse=True)
def _cost_marker_guard(request: pytest.FixtureRequest) -> Iterator[None]:
    """Fails a test that starts more than its cost marker allows (a marker to fix in cost_of)."""
    global _spawned
    _spawned = spawned = []
    try:
        yield
    finally:
        _spawned = None
    node = request.node
    if node.get_closest_marker("unit") and spawned:
        pytest.fail(f"marked unit but started {spawned[0]!r}: tests/conftest.py cost_of is wrong for it")
    if node.get_closest_marker("integration") and any(_ours(argv) for argv in spawned):
        started = next(argv for argv in spawned if _ours(argv))
        pytest.fail(f"marked integration but started {started!r}: tests/conftest.py cost_of is wrong for it")
    if node.stash.get(COST_REASON, "") == "calls" and node.stash.get(CALL_PASSED, False):
        if node.get_closest_marker("system") and not any(_ours(argv) for argv in spawned):
            pytest.fail("marked system for what its code calls, but started no process of ours: "
                        "tests/conftest.py cost_of is wrong for it")
        if node.get_closest_marker("integration") and not spawned:
            pytest.fail("marked integration for what its code calls, but started no server: "
                        "tests/conftest.py cost_of is wrong for it")


# Ctrl-C as a terminal sends it. A run started in the background of a non-interactive shell
# (`make test &`, a CI runner's job) inherits SIGINT ignored, and an ignored signal stays ignored
# across exec: every process the tests start would ignore the Ctrl-C its test sends it, and
# `shardbus up` would be killed stopping nothing (seen: four tests, -9, in such a run). A handled
# signal is reset to its default at exec, so handling it here gives the children a terminal's.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


# --- servers -----------------------------------------------------------------------------------

@pytest.fixture(scope="session")
def servers_dir() -> Iterator[Path]:
    """Where this run's servers keep their data. Not under pytest's basetemp: pytest prunes
    old basetemp directories, so a second run side by side would delete this one's."""
    path = Path(tempfile.mkdtemp(prefix="shardbus-test-"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="session")
def nats_url(servers_dir: Path) -> Iterator[str]:
    """URL of a real nats-server with JetStream."""
    if url := os.environ.get("SHARDBUS_TEST_NATS_URL"):
        yield url
        return
    server = embedded.start_nats(servers_dir / "nats")
    try:
        yield server.url
    finally:
        server.stop()


@pytest.fixture(scope="session")
def postgres_admin_url(servers_dir: Path) -> Iterator[str]:
    """URL (asyncpg driver) of a database on a real PostgreSQL we may create databases from."""
    if url := os.environ.get("SHARDBUS_TEST_DATABASE_URL"):
        yield normalise_url(url)
        return
    server = embedded.start_postgres(servers_dir / "pg" / "data", durable=False)
    try:
        yield server.url("postgres")
    finally:
        server.stop()


def _plain(url: str) -> str:
    """asyncpg wants ``postgresql://``, not SQLAlchemy's ``postgresql+asyncpg://``."""
    return url.replace("postgresql+asyncpg://", "postgresql://", 1)


def _sibling(admin_url: str, name: str) -> str:
    """The URL of database ``name`` on the server of ``admin_url``."""
    base, _, _db = admin_url.rpartition("/")
    return f"{base}/{name}"


async def _admin(admin_url: str, statement: str) -> None:
    """Run one statement (CREATE or DROP DATABASE) on the admin database."""
    admin = await asyncpg.connect(_plain(admin_url), timeout=10)
    try:
        await admin.execute(statement)
    finally:
        await admin.close()


async def _fresh_database(admin_url: str, template: str | None = None) -> str:
    """Create a database (a copy of ``template``, else empty); its name."""
    name = f"sbt_{uuid.uuid4().hex[:12]}"
    await _admin(admin_url, f'CREATE DATABASE "{name}"' + (f' TEMPLATE "{template}"' if template else ""))
    return name


@pytest.fixture
async def database_url(postgres_admin_url: str) -> AsyncIterator[str]:
    """A fresh, empty database for this test only (dropped after), as a SQLAlchemy URL."""
    name = await _fresh_database(postgres_admin_url)
    yield _sibling(postgres_admin_url, name)
    await _admin(postgres_admin_url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _in_own_loop(coro: Any) -> Any:
    """Run ``coro`` to its end on an event loop of its own thread (a session fixture's work,
    kept off the event loop pytest-asyncio keeps for the tests)."""
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coro).result()


@pytest.fixture(scope="session")
def ledger_template(postgres_admin_url: str) -> Iterator[str]:
    """The name of a database migrated to the newest schema once for this session (one per
    xdist worker), which ``migrated_database_url`` copies. Alembic disposes of its engine, so
    no connection to it stays open: CREATE DATABASE … TEMPLATE needs none. Dropped at the end."""
    name = f"sbt_tmpl_{uuid.uuid4().hex[:12]}"
    _in_own_loop(_admin(postgres_admin_url, f'CREATE DATABASE "{name}"'))
    try:
        revision = _in_own_loop(migrate.upgrade(_sibling(postgres_admin_url, name)))
        assert revision == migrate.head_revision(), revision
        yield name
    finally:
        _in_own_loop(_admin(postgres_admin_url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


async def _own_identity(url: str) -> None:
    """Give a copy of the template its own ``ledger_identity``: the migration draws one random
    id per database (the prefix of its events' ``Nats-Msg-Id`` in a stream databases share), and
    a copy would otherwise carry the template's, as every other copy does."""
    conn = await asyncpg.connect(_plain(url), timeout=10)
    try:
        if await conn.fetchval("SELECT to_regclass('ledger_identity') IS NOT NULL"):
            await conn.execute("UPDATE ledger_identity SET ledger_id = gen_random_uuid()")
    finally:
        await conn.close()


@pytest.fixture
async def migrated_database_url(postgres_admin_url: str, ledger_template: str) -> AsyncIterator[str]:
    """A fresh database at the newest schema for this test only (a copy of the session's
    migrated template with its own identity, dropped after), as a SQLAlchemy URL. Migration
    tests, which start from an empty database, use ``database_url``."""
    name = await _fresh_database(postgres_admin_url, template=ledger_template)
    url = _sibling(postgres_admin_url, name)
    await _own_identity(url)
    yield url
    await _admin(postgres_admin_url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
async def nc(nats_url: str) -> AsyncIterator[nats.NATS]:
    """A plain nats-py client, as a website would hold."""
    client = await nats.connect(nats_url, connect_timeout=5, max_reconnect_attempts=3)
    try:
        yield client
    finally:
        await client.close()


@pytest.fixture
def unique() -> str:
    """A short id unique to this test: shard ids, stream names, modules…"""
    return uuid.uuid4().hex[:10]


@pytest.fixture
def services(tmp_path, nats_url: str) -> Iterator[ServiceProcesses]:
    """Start real service processes (``shardbus run NAME``); all are stopped after the test."""
    procs = ServiceProcesses(tmp_path, nats_url)
    try:
        yield procs
    finally:
        procs.stop_all()
