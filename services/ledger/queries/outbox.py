"""The outbox relay's statements (``services/ledger/outbox_relay.py``): its lock, the ledger
id, take a batch of events, delete the published ones."""

from __future__ import annotations

from services.ledger.queries.statement import Statement

RELAY_TRY_LOCK = Statement("RELAY_TRY_LOCK", "Take the relay's advisory lock on this session, if free.", """
    SELECT pg_try_advisory_lock(:key)""")

RELAY_LEDGER_ID = Statement("RELAY_LEDGER_ID", "This database's ledger id (the prefix of every Nats-Msg-Id).", """
    SELECT ledger_id FROM ledger_identity""")

RELAY_MARK = Statement("RELAY_MARK", "The mark of the oldest batch a relay took and did not finish (none: null).", """
    SELECT min(claimed_after) FROM ledger_outbox""")

RELAY_ANY = Statement("RELAY_ANY", "Whether any event waits in the outbox.", """
    SELECT EXISTS (SELECT 1 FROM ledger_outbox)""")

RELAY_TAKE = Statement("RELAY_TAKE", """
    Take the oldest :batch events for publishing, marking each not yet marked with :mark (the
    stream's last sequence before the batch).""", """
    UPDATE ledger_outbox o SET claimed_after = COALESCE(o.claimed_after, :mark)
    FROM (SELECT id FROM ledger_outbox ORDER BY id LIMIT :batch) picked WHERE o.id = picked.id
    RETURNING o.id, o.run_id, o.type, o.run::text AS run, o.resource::text AS resource""")

RELAY_DELETE = Statement("RELAY_DELETE", "Delete the published events :ids.", """
    DELETE FROM ledger_outbox WHERE id = ANY(CAST(:ids AS bigint[]))""")

RELAY_BACKLOG = Statement("RELAY_BACKLOG", """
    How many events wait for the relay, and the oldest one's age in seconds (0: none); asked
    once a metrics scrape.""", """
    SELECT count(*), COALESCE(EXTRACT(EPOCH FROM now() - min(created_at)), 0)::float8 FROM ledger_outbox""")
