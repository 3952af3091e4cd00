"""Fixtures every test shares: a real nats-server and a real PostgreSQL, started once per
test session on free ports (or the ones named by ``SHARDBUS_TEST_NATS_URL`` and
``SHARDBUS_TEST_DATABASE_URL``), a fresh database per test, and service processes.

No mock stands in for NATS or PostgreSQL. Every process started here is stopped here, by
its own handle; the servers also die with the test run if it is killed (PDEATHSIG).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import asyncpg
import nats
import pytest

from shardbus import embedded
from shared.database import normalise_url
from tests.processes import ServiceProcesses


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


@pytest.fixture
async def database_url(postgres_admin_url: str) -> AsyncIterator[str]:
    """A fresh, empty database for this test only (dropped after), as a SQLAlchemy URL."""
    name = f"sbt_{uuid.uuid4().hex[:12]}"
    admin = await asyncpg.connect(_plain(postgres_admin_url), timeout=10)
    try:
        await admin.execute(f'CREATE DATABASE "{name}"')
    finally:
        await admin.close()
    base, _, _db = postgres_admin_url.rpartition("/")
    yield f"{base}/{name}"
    admin = await asyncpg.connect(_plain(postgres_admin_url), timeout=10)
    try:
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await admin.close()


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
