"""Migrations bring a database forward, race safely, and leave a newer database alone."""

from __future__ import annotations

import asyncio
import logging
import subprocess
import sys

import asyncpg

from services.ledger.database import migrate


def _plain(url: str) -> str:
    return url.replace("postgresql+asyncpg://", "postgresql://", 1)


async def test_an_empty_database_is_brought_to_head(database_url):
    assert await migrate.current_revision(database_url) is None
    assert await migrate.upgrade(database_url) == migrate.head_revision()
    # Upgrading again is a no-op.
    assert await migrate.upgrade(database_url) == migrate.head_revision()


async def test_upgrades_in_one_process_at_once_all_succeed(database_url):
    results = await asyncio.gather(*(migrate.upgrade(database_url) for _ in range(3)))
    assert results == [migrate.head_revision()] * 3


def test_replicas_migrating_at_once_all_succeed(database_url):
    """Four processes race to migrate one empty database; the advisory lock lines them up."""
    procs = [subprocess.Popen([sys.executable, "-m", "shardbus", "migrate", "--database-url", database_url],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for _ in range(4)]
    outputs = [proc.communicate(timeout=60)[0] for proc in procs]
    assert [proc.returncode for proc in procs] == [0] * 4, outputs


async def test_a_database_newer_than_the_code_is_left_alone_with_a_warning(database_url, caplog):
    await migrate.upgrade(database_url)
    conn = await asyncpg.connect(_plain(database_url))
    try:
        await conn.execute("UPDATE alembic_version SET version_num = 'f00dfeed9999'")
    finally:
        await conn.close()
    with caplog.at_level(logging.WARNING, logger="shardbus.ledger.migrate"):
        assert await migrate.upgrade(database_url) == "f00dfeed9999"
    assert "newer revision" in caplog.text


def test_the_migrate_command_reports_the_revision(database_url):
    done = subprocess.run([sys.executable, "-m", "shardbus", "migrate", "--database-url", database_url],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert f"at revision {migrate.head_revision()}" in done.stdout


async def test_rows_written_at_the_previous_revision_survive_the_upgrade(database_url):
    """A database at 0002 (before ``gave_up`` and the keyless log) with a run, a resource and a
    log entry in it, brought to the head."""
    assert await migrate.upgrade(database_url, "0002") == "0002"
    conn = await asyncpg.connect(_plain(database_url))
    try:
        await conn.execute("INSERT INTO runs (run_id, shard, event, status) "
                           "VALUES ('old', 'uo1', 'invasion', 'completed')")
        await conn.execute("INSERT INTO resources (run_id, module, kind, ref, status, attempts, revert, "
                           "idempotency_key) "
                           "VALUES ('old', 'lease', 'lease', 'spawn.rate', 'confirmed', 2, "
                           "'{\"expected\": \"2\", \"baseline\": \"1\"}', 'k-old')")
        await conn.execute("INSERT INTO run_log (run_id, resource_id, kind) VALUES ('old', 1, 'resource.recorded')")
        assert await migrate.upgrade(database_url) == migrate.head_revision()
        row = await conn.fetchrow("SELECT * FROM resources WHERE idempotency_key = 'k-old'")
        assert (row["status"], row["attempts"], row["gave_up"]) == ("confirmed", 2, False)
        assert row["revert"] == '{"baseline": "1", "expected": "2"}'
        assert await conn.fetchval("SELECT status FROM runs WHERE run_id = 'old'") == "completed"
        assert await conn.fetchval("SELECT count(*) FROM run_log") == 1
    finally:
        await conn.close()


async def test_rows_waiting_at_0005_get_the_time_of_their_first_miss_in_a_row(database_url):
    """Revision 0006 adds ``away_since``: a row waiting at 0005 gets its first ``cleanup.away``
    since its last answered outcome (an earlier spell of misses, answered, does not count)."""
    assert await migrate.upgrade(database_url, "0005") == "0005"
    conn = await asyncpg.connect(_plain(database_url))
    try:
        await conn.execute("INSERT INTO runs (run_id, shard, event, status) VALUES ('w', 'uo1', 'storm', 'completed')")
        row = await conn.fetchval(
            "INSERT INTO resources (run_id, module, kind, ref, status, idempotency_key, away, retry_at) "
            "VALUES ('w', 'events', 'creature', 'c1', 'confirmed', 'k-w', 2, now()) RETURNING id")
        await conn.fetchval(
            "INSERT INTO resources (run_id, module, kind, ref, status, idempotency_key) "
            "VALUES ('w', 'events', 'creature', 'c2', 'confirmed', 'k-fine') RETURNING id")
        for kind, at in (("cleanup.away", "2026-01-01 10:00Z"), ("cleanup.failed", "2026-01-01 11:00Z"),
                         ("cleanup.claimed", "2026-01-01 11:59Z"), ("cleanup.away", "2026-01-01 12:00Z"),
                         ("cleanup.claimed", "2026-01-01 12:01Z"), ("cleanup.away", "2026-01-01 12:02Z")):
            await conn.execute("INSERT INTO run_log (run_id, resource_id, kind, at) "
                               "VALUES ('w', $1, $2, CAST($3::text AS timestamptz))", row, kind, at)
        assert await migrate.upgrade(database_url) == migrate.head_revision()
        since = {r["ref"]: r["away_since"] for r in await conn.fetch("SELECT ref, away_since FROM resources")}
        assert since["c1"].isoformat() == "2026-01-01T12:00:00+00:00" and since["c2"] is None
    finally:
        await conn.close()
