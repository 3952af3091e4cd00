"""The ledger's update events: the outbox relay and the events stream (docs/ledger.md, "Layout")."""
