"""The ledger service."""
