"""The ledger's request payloads (pydantic, camelCase on the wire, strict types). A request
that fails validation is answered 400 naming the field by the shared broker middleware."""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic.alias_generators import to_camel

from services.ledger.statuses import CLEANUP_STATUSES, RUN_STATUSES
from services.ledger.tables import ERROR_MAX, ID_PATTERN, IDEMPOTENCY_KEY_MAX, KIND_MAX, REF_MAX
from shared.subjects import SHARD_ID_PATTERN

RunId = Annotated[str, Field(pattern=ID_PATTERN, description="A run id: letters, digits, _ and -, at most 64.")]
"""A run id; it becomes the token of the run's event subject."""

Module = Annotated[str, Field(pattern=ID_PATTERN, description="A module name: letters, digits, _ and -, at most 64.")]
"""A module name; it is the token of its expiry and reconcile subjects."""

Kind = Annotated[str, Field(min_length=1, max_length=KIND_MAX)]
"""A resource kind (e.g. ``creature``, ``lease``)."""

Ref = Annotated[str, Field(min_length=1, max_length=REF_MAX)]
"""What the resource is within its kind (a serial, a config key …)."""

ResourceId = Annotated[int, Field(ge=1)]
"""A resource row's id."""

ErrorText = Annotated[str, Field(max_length=ERROR_MAX)]
"""A sentence saying what went wrong."""

OUTCOMES_MAX = 1000
"""The most give-back outcomes one ``ledger.sweep.outcomes`` request records."""

MaxAttempts = Annotated[int, Field(ge=1, le=1000)]
"""How many give-back attempts a row gets before it wants a person."""

RunStatus = Literal[RUN_STATUSES]  # type: ignore[valid-type]
"""A run status."""

CleanupStatus = Literal[CLEANUP_STATUSES]  # type: ignore[valid-type]
"""A run's cleanup status."""


def is_module_name(value: object) -> bool:
    """True when ``value`` (e.g. a subject's last token) is a valid module name."""
    return isinstance(value, str) and _MODULE_NAME.fullmatch(value) is not None  # ``$`` passes "uo\n"


_MODULE_NAME = re.compile(ID_PATTERN)


class LedgerRequest(BaseModel):
    """Base of every request: camelCase names, strict types, unknown fields ignored."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, strict=True, extra="ignore")


class CreateRun(LedgerRequest):
    run_id: RunId | None = None
    shard: str = Field(pattern=f"^{SHARD_ID_PATTERN}$")
    event: str = Field(min_length=1, max_length=128)


class SetRunStatus(LedgerRequest):
    run_id: RunId
    status: RunStatus


class AddResource(LedgerRequest):
    run_id: RunId
    module: Module
    kind: Kind
    ref: Ref
    idempotency_key: str = Field(min_length=1, max_length=IDEMPOTENCY_KEY_MAX)
    revert: dict[str, Any] = Field(default_factory=dict)
    lease_deadline: int | None = Field(default=None, ge=0)


class ResourceRef(LedgerRequest):
    resource_id: ResourceId


class FailResource(LedgerRequest):
    resource_id: ResourceId
    error: ErrorText


class Reconcile(LedgerRequest):
    run_id: RunId
    kind: Kind | None = None
    present: list[Ref] = Field(max_length=100_000)


class RunRef(LedgerRequest):
    run_id: RunId


class ListRuns(LedgerRequest):
    status: RunStatus | None = None
    cleanup_status: CleanupStatus | None = None
    limit: int = Field(default=100, ge=1, le=1000)


class LiveRows(LedgerRequest):
    module: Module
    limit: int = Field(default=1000, ge=1, le=10_000)


class LiveModules(LedgerRequest):
    limit: int = Field(default=1000, ge=1, le=10_000)


class Settle(LedgerRequest):
    pass


class Candidates(LedgerRequest):
    max_attempts: MaxAttempts = 3
    limit: int = Field(default=100, ge=1, le=1000)


class Claim(LedgerRequest):
    run_id: RunId
    max_attempts: MaxAttempts = 3
    limit: int = Field(default=100, ge=1, le=1000)
    claim_timeout_s: float = Field(default=60.0, gt=0)


class Drifted(LedgerRequest):
    resource_id: ResourceId
    error: ErrorText | None = None


class SweepFailed(LedgerRequest):
    resource_id: ResourceId
    error: ErrorText
    transient: bool


class SweepOutcome(LedgerRequest):
    resource_id: ResourceId
    verdict: Literal["reverted", "drifted", "failed", "transient"]
    error: ErrorText | None = None

    @model_validator(mode="after")
    def _failures_say_why(self) -> SweepOutcome:
        if self.verdict in ("failed", "transient") and not self.error:
            raise ValueError(f"error is required when the verdict is {self.verdict}")
        return self


class SweepOutcomes(LedgerRequest):
    outcomes: list[SweepOutcome] = Field(min_length=1, max_length=OUTCOMES_MAX)

    @model_validator(mode="after")
    def _one_outcome_per_row(self) -> SweepOutcomes:
        ids = [o.resource_id for o in self.outcomes]
        if len(ids) != len(set(ids)):
            twice = sorted({i for i in ids if ids.count(i) > 1})
            raise ValueError(f"outcomes name resource {', '.join(map(str, twice[:5]))} more than once")
        return self


class Finish(LedgerRequest):
    run_id: RunId
    max_attempts: MaxAttempts = 3
    summary: dict[str, Any] = Field(default_factory=dict)
