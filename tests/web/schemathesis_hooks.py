"""Schemathesis hooks for tests/web/test_schemathesis.py (``SCHEMATHESIS_HOOKS``): rules between
two fields, which a JSON schema cannot say, kept by the data Schemathesis generates."""

from __future__ import annotations

from typing import Any

import schemathesis


@schemathesis.hook("filter_body").apply_to(name="POST /runs")
def a_run_ends_after_it_starts(_context: Any, body: Any) -> bool:
    """``endsAt`` must not be before ``startsAt`` (docs/contracts.md, "Ledger": the ledger's 400)."""
    if not isinstance(body, dict):
        return True
    starts, ends = body.get("startsAt"), body.get("endsAt")
    numbers = all(isinstance(v, int | float) and not isinstance(v, bool) for v in (starts, ends))
    return not numbers or ends >= starts
