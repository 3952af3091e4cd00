"""Fixtures of the contract tests: each owner's fixtures, taken from its own tests' conftest."""

from tests.gateway.conftest import gateway, shard_sims, start_gateway  # noqa: F401  (fixtures)
from tests.ledger.conftest import db, ledger, ledger_db  # noqa: F401  (fixtures)
