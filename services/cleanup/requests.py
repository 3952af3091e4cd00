"""The payloads the cleanup service accepts (validated; a bad one is a 400 naming the field),
and :func:`decode_body`, which reads every request body so that what Python's ``json``
cannot read (nesting deeper than its recursion limit, an integer of more than 4,300 digits)
is a 400 too, not a 500."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from shared.request_body import decode_body  # noqa: F401  (the cleanup subjects' decoder)
from shared.subjects import LEDGER_ID_PATTERN

RUN_ID_PATTERN = rf"^{LEDGER_ID_PATTERN}$"
"""What a run id may look like (the ledger's rule: it becomes a subject token)."""

RunId = Annotated[str, StringConstraints(pattern=RUN_ID_PATTERN)]
"""A run id: letters, digits, ``_`` and ``-``, at most 64 (so no NUL, no surrogate either)."""

ModuleName = Annotated[str, StringConstraints(pattern=rf"^{LEDGER_ID_PATTERN}$")]
"""A module id: it becomes a subject token, so no dots, wildcards or spaces."""


class CleanupRequest(BaseModel):
    """Base of every request: strict types, unknown fields ignored."""

    model_config = ConfigDict(populate_by_name=True, extra="ignore", strict=True)


class SweepRequest(CleanupRequest):
    """``cleanup.sweep``: every candidate run, or only ``runId``."""

    run_id: RunId | None = Field(default=None, alias="runId")


class RetryRequest(CleanupRequest):
    """``cleanup.retry``: the ``incomplete`` run to sweep again."""

    run_id: RunId = Field(alias="runId")


class ReconcileRequest(CleanupRequest):
    """``cleanup.reconcile``: the modules to check (default: every module owning a live row, and
    the configured ones)."""

    modules: list[ModuleName] | None = Field(default=None, max_length=100)


