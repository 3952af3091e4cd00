"""The payloads the cleanup service accepts (validated; a bad one is a 400 naming the field)."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

RUN_ID_MAX = 190
"""Longest run id accepted (the ledger's own limit is the authority; this only stops junk)."""

ModuleName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_-]{1,64}$")]
"""A module id: it becomes a subject token, so no dots, wildcards or spaces."""


class SweepRequest(BaseModel):
    """``cleanup.sweep``: every candidate run, or only ``runId``."""

    model_config = ConfigDict(populate_by_name=True, extra="ignore")

    run_id: str | None = Field(default=None, alias="runId", min_length=1, max_length=RUN_ID_MAX)


class RetryRequest(BaseModel):
    """``cleanup.retry``: the ``incomplete`` run to sweep again."""

    model_config = ConfigDict(populate_by_name=True, extra="ignore")

    run_id: str = Field(alias="runId", min_length=1, max_length=RUN_ID_MAX)


class ReconcileRequest(BaseModel):
    """``cleanup.reconcile``: the modules to check (default: every module owning a live row, and
    the configured ones)."""

    model_config = ConfigDict(extra="ignore")

    modules: list[ModuleName] | None = Field(default=None, max_length=100)
