"""The ledger's request payloads (pydantic, camelCase on the wire, strict types). A request
that fails validation is answered 400 naming the field by the shared broker middleware.

Every field is bounded: numbers by what their column holds (PostgreSQL's bigint) or a sane
range (seconds), text by its column's length and by what PostgreSQL can store (no NUL, no lone
surrogate), and the free-form JSON objects (``revert``, ``summary``) by their size as
PostgreSQL prints them, so that no row can make a reply outgrow a NATS message
(docs/ledger.md, "Limits and pages"). Request bodies are read by :func:`decode_body`, which
turns what Python's ``json`` cannot read (nesting deeper than its recursion limit, an integer
of more than 4,300 digits) into a 400 instead of a 500."""

from __future__ import annotations

import json
import math
import re
from decimal import Decimal
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator
from pydantic.alias_generators import to_camel

from services.ledger.statuses import CLEANUP_STATUSES, RUN_STATUSES
from services.ledger.tables import ERROR_MAX, ID_PATTERN, IDEMPOTENCY_KEY_MAX, KIND_MAX, REF_MAX
from shared.request_body import INT_DIGITS_MAX, OversizedNumber, decode_body  # noqa: F401  (decode_body: app.py)
from shared.subjects import SHARD_ID_PATTERN

BIGINT_MAX = 2**63 - 1
"""The largest value of a PostgreSQL ``bigint`` (resource ids, lease deadlines)."""

LEASE_DEADLINE_MAX = 253_402_300_799_999
"""The latest lease deadline taken: 9999-12-31T23:59:59.999Z in epoch milliseconds."""

CLAIM_TIMEOUT_MAX_S = 86_400.0
"""The longest claim timeout taken (a day; the cleanup service's default is 120 s)."""

REVERT_MAX_BYTES = 8 * 1024
"""The largest ``revert`` taken, in bytes as PostgreSQL prints it (``{"key": "value"}``, UTF-8):
what a give-back needs is a handful of keys and values."""

SUMMARY_MAX_BYTES = 64 * 1024
"""The largest sweep ``summary`` taken (bytes as PostgreSQL prints it); it goes to the run log."""

JSON_DEPTH_MAX = 32
"""The deepest nesting of objects and arrays taken inside ``revert`` or ``summary``."""


def _storable(value: str) -> str:
    """Text PostgreSQL can store: no NUL character, no lone surrogate."""
    if "\x00" in value:
        raise ValueError("must not contain the NUL character (U+0000)")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("must not contain a lone surrogate (U+D800 to U+DFFF)") from None
    return value


Text = AfterValidator(_storable)
"""Applied to every text field."""

RunId = Annotated[str, Field(pattern=ID_PATTERN, description="A run id: letters, digits, _ and -, at most 64.")]
"""A run id; it becomes the token of the run's event subject."""

Module = Annotated[str, Field(pattern=ID_PATTERN, description="A module name: letters, digits, _ and -, at most 64.")]
"""A module name; it is the token of its expiry and reconcile subjects."""

Kind = Annotated[str, Field(min_length=1, max_length=KIND_MAX), Text]
"""A resource kind (e.g. ``creature``, ``lease``)."""

Ref = Annotated[str, Field(min_length=1, max_length=REF_MAX), Text]
"""What the resource is within its kind (a serial, a config key …)."""

ResourceId = Annotated[int, Field(ge=1, le=BIGINT_MAX)]
"""A resource row's id."""

After = Annotated[int, Field(ge=0, le=BIGINT_MAX)]
"""A page's continuation: the ``next`` of the page before (rows with a greater id follow)."""

ErrorText = Annotated[str, Field(max_length=ERROR_MAX), Text]
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


def is_storable(value: object) -> bool:
    """True when ``value`` is text PostgreSQL can store (see :data:`Text`)."""
    try:
        return isinstance(value, str) and _storable(value) is value
    except ValueError:
        return False


def _number_text(value: int | float) -> str:
    """A number as PostgreSQL prints it back from jsonb (numeric: no exponent, no -0)."""
    if isinstance(value, int):
        return str(value)
    if not math.isfinite(value):
        raise ValueError("must hold finite numbers only (no NaN or Infinity)")
    if value == 0:
        return "0.0"  # PostgreSQL's numeric has no negative zero
    return format(Decimal(repr(value)), "f")


def rendered_size(value: Any, limit: int | None = None) -> int:
    """Bytes of ``value`` as PostgreSQL prints it as jsonb text (``{"k": v, "k2": [1, 2]}``,
    UTF-8, escapes as it writes them, numbers without exponents): what a reply carrying it
    spends. ValueError for what jsonb cannot hold (NaN, NUL, lone surrogates) or nesting
    deeper than :data:`JSON_DEPTH_MAX`; stops counting once past ``limit``."""
    total = 0
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, str):
            _storable(item)
            total += len(json.dumps(item, ensure_ascii=False).encode("utf-8"))
        elif item is None or isinstance(item, bool):
            total += {None: 4, True: 4, False: 5}[item]
        elif isinstance(item, (int, float)):
            total += len(_number_text(item))
        elif isinstance(item, OversizedNumber):
            raise ValueError(f"must not hold an integer of more than {INT_DIGITS_MAX} digits")
        elif isinstance(item, (dict, list)):
            if depth > JSON_DEPTH_MAX:
                raise ValueError(f"must not nest objects and arrays deeper than {JSON_DEPTH_MAX} levels")
            total += 2 + 2 * max(0, len(item) - 1)  # {} or [], ", " between members
            if isinstance(item, dict):
                for key, member in item.items():
                    if not isinstance(key, str):
                        raise ValueError("must have text keys only")
                    stack.append((key, depth))
                    total += 2  # ": "
                    stack.append((member, depth + 1))
            else:
                stack.extend((member, depth + 1) for member in item)
        else:
            raise ValueError(f"must hold JSON values only, not {item!r}")
        if limit is not None and total > limit:
            break
    return total


def _capped(name: str, limit: int):  # noqa: ANN202  (a validator factory)
    def check(value: dict[str, Any]) -> dict[str, Any]:
        if rendered_size(value, limit) > limit:
            raise ValueError(f"{name} takes more than {limit} bytes as stored (at most {limit // 1024} KiB, "
                             f"counted as PostgreSQL prints it)")
        return value
    return AfterValidator(check)


Revert = Annotated[dict[str, Any], _capped("revert", REVERT_MAX_BYTES)]
"""What a give-back needs (a JSON object of at most :data:`REVERT_MAX_BYTES`)."""

Summary = Annotated[dict[str, Any], _capped("summary", SUMMARY_MAX_BYTES)]
"""A sweep's summary for the run log (a JSON object of at most :data:`SUMMARY_MAX_BYTES`)."""


class LedgerRequest(BaseModel):
    """Base of every request: camelCase names, strict types, no NaN or Infinity, unknown
    fields ignored."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, strict=True, extra="ignore",
                              allow_inf_nan=False)


Millis = Annotated[int, Field(ge=0, le=LEASE_DEADLINE_MAX)]
"""A moment in epoch milliseconds (up to 9999-12-31)."""

RUNS_CURSOR = re.compile(r"(\d{1,19}):([A-Za-z0-9_-]{1,64})")
"""A ``ledger.runs`` page's ``next``: the last run's sort key (a number) and its id."""


def _runs_cursor(value: str) -> str:
    found = RUNS_CURSOR.fullmatch(value)
    if not found or int(found.group(1)) > BIGINT_MAX:
        raise ValueError("must be the `next` of the page before (a number, a colon and a run id)")
    return value


class CreateRun(LedgerRequest):
    run_id: RunId | None = None
    shard: str = Field(pattern=f"^{SHARD_ID_PATTERN}$")
    event: Annotated[str, Field(min_length=1, max_length=128), Text]
    starts_at: Millis | None = None
    ends_at: Millis | None = None

    @model_validator(mode="after")
    def _ends_after_start(self) -> "CreateRun":
        if self.starts_at is not None and self.ends_at is not None and self.ends_at < self.starts_at:
            raise ValueError("endsAt must not be before startsAt")
        return self


class SetRunStatus(LedgerRequest):
    run_id: RunId
    status: RunStatus


class AddResource(LedgerRequest):
    run_id: RunId
    module: Module
    kind: Kind
    ref: Ref
    idempotency_key: Annotated[str, Field(min_length=1, max_length=IDEMPOTENCY_KEY_MAX), Text]
    revert: Revert = Field(default_factory=dict)
    lease_deadline: int | None = Field(default=None, ge=0, le=LEASE_DEADLINE_MAX)


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


class Console(LedgerRequest):
    run_id: RunId
    after: After | None = None
    limit: int = Field(default=1000, ge=1, le=1000)


class RunLogPage(LedgerRequest):
    run_id: RunId
    after: After | None = None
    limit: int = Field(default=1000, ge=1, le=1000)


class ListRuns(LedgerRequest):
    status: RunStatus | None = None
    cleanup_status: CleanupStatus | None = None
    shard: str | None = Field(default=None, pattern=f"^{SHARD_ID_PATTERN}$")
    starts_from: Millis | None = None
    starts_before: Millis | None = None
    after: Annotated[str, AfterValidator(_runs_cursor)] | None = Field(default=None, max_length=100)
    limit: int = Field(default=100, ge=1, le=1000)

    @model_validator(mode="after")
    def _window(self) -> "ListRuns":
        if (self.starts_from is not None and self.starts_before is not None
                and self.starts_before <= self.starts_from):
            raise ValueError("startsBefore must be after startsFrom")
        return self

    @property
    def by_schedule(self) -> bool:
        """A time window orders by ``startsAt`` (a calendar); otherwise newest first."""
        return self.starts_from is not None or self.starts_before is not None


class LeasesOverdue(LedgerRequest):
    limit: int = Field(default=100, ge=1, le=1000)


class LiveRows(LedgerRequest):
    module: Module
    after: After | None = None
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
    claim_timeout_s: float = Field(default=60.0, gt=0, le=CLAIM_TIMEOUT_MAX_S)


class Drifted(LedgerRequest):
    resource_id: ResourceId
    error: ErrorText | None = None


class SweepFailed(LedgerRequest):
    resource_id: ResourceId
    error: ErrorText
    transient: bool


class SweepOutcome(LedgerRequest):
    resource_id: ResourceId
    verdict: Literal["reverted", "drifted", "failed", "transient", "away"]
    error: ErrorText | None = None

    @model_validator(mode="after")
    def _failures_say_why(self) -> SweepOutcome:
        if self.verdict in ("failed", "transient", "away") and not self.error:
            raise ValueError(f"error is required when the verdict is {self.verdict}")
        return self


AWAY_BACKOFF_S = 2.0
"""The first wait of a row whose give-back met nobody (``away``), when the request names none."""

AWAY_BACKOFF_MAX_S = 60.0
"""The longest wait of such a row, when the request names none."""

AWAY_BACKOFF_MIN_S = 0.01
"""The shortest back-off base taken."""

AWAY_BACKOFF_LIMIT_S = 86_400.0
"""The longest back-off taken (a day)."""


class SweepOutcomes(LedgerRequest):
    outcomes: list[SweepOutcome] = Field(min_length=1, max_length=OUTCOMES_MAX)
    away_backoff_s: float = Field(default=AWAY_BACKOFF_S, ge=AWAY_BACKOFF_MIN_S, le=AWAY_BACKOFF_LIMIT_S)
    away_backoff_max_s: float = Field(default=AWAY_BACKOFF_MAX_S, ge=AWAY_BACKOFF_MIN_S, le=AWAY_BACKOFF_LIMIT_S)

    @model_validator(mode="after")
    def _one_outcome_per_row(self) -> SweepOutcomes:
        ids = [o.resource_id for o in self.outcomes]
        if len(ids) != len(set(ids)):
            twice = sorted({i for i in ids if ids.count(i) > 1})
            raise ValueError(f"outcomes name resource {', '.join(map(str, twice[:5]))} more than once")
        return self

    @model_validator(mode="after")
    def _cap_not_below_base(self) -> SweepOutcomes:
        if self.away_backoff_max_s < self.away_backoff_s:
            raise ValueError(f"awayBackoffMaxS ({self.away_backoff_max_s:g}) must not be less than awayBackoffS "
                             f"({self.away_backoff_s:g})")
        return self


class Waiting(LedgerRequest):
    limit: int = Field(default=100, ge=1, le=1000)


class Finish(LedgerRequest):
    run_id: RunId
    max_attempts: MaxAttempts = 3
    summary: Summary = Field(default_factory=dict)
