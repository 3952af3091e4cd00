"""The relay's statements (``services/ledger/events/outbox_relay.py``): its lock, the ledger id, the
run log's events above the watermark, the watermark moved, the visibility horizon that tells a
rolled-back id from one still to commit; and the legacy outbox's (events written before
revision 0007): take a batch, delete the published ones."""

from __future__ import annotations

from services.ledger.database.queries.statement import Statement

RELAY_TRY_LOCK = Statement("RELAY_TRY_LOCK", "Take the relay's advisory lock on this session, if free.", """
    SELECT pg_try_advisory_lock(:key)""")

RELAY_LEDGER_ID = Statement("RELAY_LEDGER_ID", "This database's ledger id (the prefix of every Nats-Msg-Id).", """
    SELECT ledger_id FROM ledger_identity""")

RELAY_STATE = Statement("RELAY_STATE", """
    The relay's watermark (every event up to it published or never committed) and the stream's
    sequence after the last batch it finished.""", """
    SELECT relayed_through, stream_after FROM ledger_relay""")

RELAY_START = Statement("RELAY_START", """
    A relay's first look at the stream: where a batch published from now on begins, kept only
    when none is known yet (a dead relay's mark stays until its batch is found).""", """
    UPDATE ledger_relay SET stream_after = COALESCE(stream_after, :seq)""")

RELAY_EVENTS = Statement("RELAY_EVENTS", """
    The run log's entries above :after, oldest first, at most :batch: each entry's id (its
    event id), and for an event (an entry with a run; entries of older code have none) its
    run id, kind and JSON.""", """
    SELECT id, run_id, kind, run::text AS run, resource::text AS resource FROM run_log
    WHERE id > :after ORDER BY id LIMIT :batch""")

RELAY_HORIZON = Statement("RELAY_HORIZON", """
    The oldest transaction still running (pg_snapshot_xmin) and the first not yet begun
    (pg_snapshot_xmax) as text: an id missing below the newest visible one is rolled back for
    good once every transaction that ran when it was first missed has ended.""", """
    SELECT pg_snapshot_xmin(s)::text AS xmin, pg_snapshot_xmax(s)::text AS xmax
    FROM pg_current_snapshot() AS s""")

RELAY_ADVANCE = Statement("RELAY_ADVANCE", """
    Move the watermark to :through (never back) and remember the stream's sequence after the
    batch (:seq).""", """
    UPDATE ledger_relay SET relayed_through = greatest(relayed_through, :through),
                            stream_after = greatest(COALESCE(stream_after, 0), :seq)""")

RELAY_BACKLOG = Statement("RELAY_BACKLOG", """
    How many events wait for the relay (above its watermark, and any left in the legacy outbox),
    and the oldest one's age in seconds (0: none); asked once a metrics scrape.""", """
    WITH waiting AS (
        SELECT l.at FROM run_log l, ledger_relay w WHERE l.id > w.relayed_through AND l.run IS NOT NULL
        UNION ALL
        SELECT created_at FROM ledger_outbox
    )
    SELECT count(*), COALESCE(EXTRACT(EPOCH FROM now() - min(at)), 0)::float8 FROM waiting""")

LEGACY_MARK = Statement("LEGACY_MARK", """
    The mark of the oldest legacy-outbox batch a relay took and did not finish (none: null).""", """
    SELECT min(claimed_after) FROM ledger_outbox""")

LEGACY_ANY = Statement("LEGACY_ANY", "Whether any event waits in the legacy outbox.", """
    SELECT EXISTS (SELECT 1 FROM ledger_outbox)""")

LEGACY_TAKE = Statement("LEGACY_TAKE", """
    Take the oldest :batch legacy-outbox events for publishing, marking each not yet marked
    with :mark (the stream's last sequence before the batch).""", """
    UPDATE ledger_outbox o SET claimed_after = COALESCE(o.claimed_after, :mark)
    FROM (SELECT id FROM ledger_outbox ORDER BY id LIMIT :batch) picked WHERE o.id = picked.id
    RETURNING o.id, o.run_id, o.type, o.run::text AS run, o.resource::text AS resource""")

LEGACY_DELETE = Statement("LEGACY_DELETE", "Delete the published legacy-outbox events :ids.", """
    DELETE FROM ledger_outbox WHERE id = ANY(CAST(:ids AS bigint[]))""")
