"""The ledger's requests are its contract: shared/contracts/ledger.py, written once for the
ledger and its clients. The names the ledger's modules read are taken from there."""

from __future__ import annotations

from shared.contracts.ledger import (  # noqa: F401  (re-exported for the ledger's modules)
    REVERT_MAX_BYTES,
    RUNS_CURSOR,
    ListRuns,
    is_module_name,
    is_storable,
    rendered_size,
)
