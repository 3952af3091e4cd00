"""The five shardbus services — gateway, ledger, cleanup, installer, web — each a folder; they
meet on NATS subjects, never on imports (docs/architecture.md)."""
