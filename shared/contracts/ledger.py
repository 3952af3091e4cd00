"""The ledger's contract (docs/contracts.md, "Ledger"): every request it takes and every reply
it gives, with their limits, written once for the ledger and for each of its clients (cleanup,
the web door, ``shardbus status``). Requests are pydantic models, camelCase on the wire,
strict types; a request that fails validation is answered 400 naming the field.

Every field is bounded: numbers by what their column holds (PostgreSQL's bigint) or a sane
range (seconds), text by its column's length and by what PostgreSQL can store (no NUL, no lone
surrogate), and the free-form JSON objects (``revert``, ``summary``) by their size as
PostgreSQL prints them, so that no row can make a reply outgrow a NATS message
(docs/ledger.md, "Limits and pages"). Request bodies are read by
:func:`shared.request_body.decode_body`, which turns what Python's ``json`` cannot read
(nesting deeper than its recursion limit, an integer of more than 4,300 digits) into a 400."""

from __future__ import annotations

import dataclasses
import json
import math
import re
from decimal import Decimal
from typing import Annotated, Any, get_args, get_origin

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, GetJsonSchemaHandler, model_validator
from pydantic.alias_generators import to_camel
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import CoreSchema

from shared import subjects
from shared.contracts import Contract
from shared.contracts.ids import LEDGER_ID_PATTERN, ModuleName, RunId, ShardId, is_ledger_id
from shared.contracts.ledger_statuses import (
    VERDICT_AWAY,
    VERDICT_FAILED,
    VERDICT_TRANSIENT,
    CleanupStatus,
    ResourceStatus,
    RunStatus,
    Verdict,
)
from shared.replies import Reply
from shared.request_body import INT_DIGITS_MAX, OversizedNumber

KIND_MAX = 64
"""Longest resource kind."""

REF_MAX = 190
"""Longest resource ref (fits a btree index entry with room to spare)."""

ERROR_MAX = 1000
"""Longest stored error sentence (longer ones are cut)."""

IDEMPOTENCY_KEY_MAX = 200
"""Longest idempotency key."""

PAGE_LIMIT_MAX = 1000
"""The most runs or rows one candidates, claim, console, log or runs request asks for."""

LIVE_LIMIT_MAX = 10_000
"""The most live rows (or modules) one ``ledger.live`` (``ledger.live.modules``) page lists."""

BIGINT_MAX = 2**63 - 1
"""The largest value of a PostgreSQL ``bigint`` (resource ids, lease deadlines)."""

LEASE_DEADLINE_MAX = 253_402_300_799_999
"""The latest lease deadline taken: 9999-12-31T23:59:59.999Z in epoch milliseconds."""

CLAIM_TIMEOUT_MAX_S = 86_400.0
"""The longest claim timeout taken (a day; the cleanup service's default is 120 s)."""

WAITING_LONGER_THAN_MAX_S = 30 * 86_400.0
"""The longest ``longerThanS`` ``ledger.sweep.waiting`` takes (30 days)."""

AWAY_ALERT_S = 900.0
"""``SHARDBUS_AWAY_ALERT_S``'s default: a run waiting longer than this for its shard or module
is flagged (console, ``shardbus status``, a metric, a log line) — it wants a person."""

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


NO_NUL_PATTERN = "^[^\\u0000]*$"
"""What :func:`_storable` checks, as a JSON schema says it (a lone surrogate cannot be sent as
UTF-8 at all)."""


@dataclasses.dataclass(frozen=True, slots=True)
class _StorableText(AfterValidator):
    """:func:`_storable` after the type's own checks, and its rule in the JSON schema (the web
    door's OpenAPI document: docs/web.md, "The OpenAPI document")."""

    def __get_pydantic_json_schema__(self, core_schema: CoreSchema, handler: GetJsonSchemaHandler) -> JsonSchemaValue:
        schema = handler(core_schema)
        schema["pattern"] = NO_NUL_PATTERN
        return schema


Text = _StorableText(_storable)
"""Applied to every text field."""

Module = ModuleName
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


is_module_name = is_ledger_id
"""True when ``value`` (e.g. a subject's last token) is a valid module name (fullmatch)."""


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
    # shape: one iterative walk rather than recursion: a hostile body nests as deep as it likes.
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


def _capped(name: str, limit: int) -> AfterValidator:
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


def _takes_int(annotation: Any) -> bool:
    """True for an ``int`` field, or an optional one (``int | None``), annotated or not."""
    if get_origin(annotation) is Annotated:
        return _takes_int(get_args(annotation)[0])
    if annotation is int:
        return True
    members = [a for a in get_args(annotation) if a is not type(None)]
    return len(members) == 1 and type(None) in get_args(annotation) and _takes_int(members[0])


class LedgerRequest(BaseModel):
    """Base of every request: camelCase names, strict types, no NaN or Infinity, unknown
    fields ignored. An integer may be written with a zero fraction (``4041.0``): JSON has one
    number type, and JSON Schema calls such a number an integer (docs/contracts.md, "Ledger");
    a fraction (``4041.5``), a string or a boolean is still a 400."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, strict=True, extra="ignore",
                              allow_inf_nan=False)

    @model_validator(mode="before")
    @classmethod
    def _whole_numbers(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        for name, info in cls.model_fields.items():
            for key in {info.alias or name, name}:
                value = data.get(key)
                if type(value) is float and value.is_integer() and _takes_int(info.annotation):
                    data = {**data, key: int(value)}
        return data


Millis = Annotated[int, Field(ge=0, le=LEASE_DEADLINE_MAX)]
"""A moment in epoch milliseconds (up to 9999-12-31)."""

RUNS_CURSOR = re.compile(rf"(\d{{1,19}}):({LEDGER_ID_PATTERN})")
"""A ``ledger.runs`` page's ``next``: the last run's sort key (a number) and its id."""


def _runs_cursor(value: str) -> str:
    found = RUNS_CURSOR.fullmatch(value)
    if not found or int(found.group(1)) > BIGINT_MAX:
        raise ValueError("must be the `next` of the page before (a number, a colon and a run id)")
    return value


class CreateRun(LedgerRequest):
    run_id: RunId | None = None
    shard: ShardId
    event: Annotated[str, Field(min_length=1, max_length=128), Text]
    starts_at: Millis | None = None
    ends_at: Millis | None = None

    @model_validator(mode="after")
    def _ends_after_start(self) -> CreateRun:
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


class Expired(LedgerRequest):
    """``ledger.expired.<module>``: what a module sends. The ledger reads it leniently (a
    malformed expiry answers ``{expired: 0}`` and writes nothing, docs/ledger.md, "Expiry"), so a module never
    sees a 400 for it; a client still sends this shape."""

    kind: Kind
    ref: Ref


class Reconcile(LedgerRequest):
    run_id: RunId
    kind: Kind | None = None
    present: list[Ref] = Field(max_length=100_000)


class RunRef(LedgerRequest):
    run_id: RunId


class Console(LedgerRequest):
    run_id: RunId
    after: After | None = None
    limit: int = Field(default=PAGE_LIMIT_MAX, ge=1, le=PAGE_LIMIT_MAX)


class RunLogPage(LedgerRequest):
    run_id: RunId
    after: After | None = None
    limit: int = Field(default=PAGE_LIMIT_MAX, ge=1, le=PAGE_LIMIT_MAX)


class ListRuns(LedgerRequest):
    status: RunStatus | None = None
    cleanup_status: CleanupStatus | None = None
    shard: ShardId | None = None
    starts_from: Millis | None = None
    starts_before: Millis | None = None
    after: Annotated[str, AfterValidator(_runs_cursor)] | None = Field(default=None, max_length=100)
    limit: int = Field(default=100, ge=1, le=PAGE_LIMIT_MAX)

    @model_validator(mode="after")
    def _window(self) -> ListRuns:
        if (self.starts_from is not None and self.starts_before is not None
                and self.starts_before <= self.starts_from):
            raise ValueError("startsBefore must be after startsFrom")
        return self

    @property
    def by_schedule(self) -> bool:
        """A time window orders by ``startsAt`` (a calendar); otherwise newest first."""
        return self.starts_from is not None or self.starts_before is not None


class LeasesOverdue(LedgerRequest):
    limit: int = Field(default=100, ge=1, le=PAGE_LIMIT_MAX)


class LiveRows(LedgerRequest):
    module: Module
    after: After | None = None
    limit: int = Field(default=1000, ge=1, le=LIVE_LIMIT_MAX)


class LiveModules(LedgerRequest):
    limit: int = Field(default=1000, ge=1, le=LIVE_LIMIT_MAX)


class Settle(LedgerRequest):
    pass


class Candidates(LedgerRequest):
    max_attempts: MaxAttempts = 3
    limit: int = Field(default=100, ge=1, le=PAGE_LIMIT_MAX)


class Claim(LedgerRequest):
    run_id: RunId
    max_attempts: MaxAttempts = 3
    limit: int = Field(default=100, ge=1, le=PAGE_LIMIT_MAX)
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
    verdict: Verdict
    error: ErrorText | None = None

    @model_validator(mode="after")
    def _failures_say_why(self) -> SweepOutcome:
        if self.verdict in (VERDICT_FAILED, VERDICT_TRANSIENT, VERDICT_AWAY) and not self.error:
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
    limit: int = Field(default=100, ge=1, le=PAGE_LIMIT_MAX)
    run_id: RunId | None = None
    """Only this run (the console's run page)."""
    longer_than_s: float | None = Field(default=None, ge=0, le=WAITING_LONGER_THAN_MAX_S)
    """Only runs waiting longer than this (the away alert, ``SHARDBUS_AWAY_ALERT_S``)."""


class Finish(LedgerRequest):
    run_id: RunId
    max_attempts: MaxAttempts = 3
    summary: Summary = Field(default_factory=dict)


# --- replies ----------------------------------------------------------------------------
# Every reply carries ``status`` (and ``error`` when it is not 2xx: :class:`shared.replies.Reply`).
# The models below are the 2xx replies. They take fields they do not know (a newer ledger may
# add one); ``tests/contracts`` checks that the ledger sends none they do not name.


class LedgerReply(Reply):
    """Base of the ledger's 2xx replies: camelCase on the wire."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="allow")


class WireRow(BaseModel):
    """Base of a run, resource or log row as the ledger renders it."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="allow")


class Run(WireRow):
    run_id: str
    shard: str
    event: str
    status: RunStatus
    colour: str
    cleanup_status: CleanupStatus
    cleanup_word: str
    cleanup_colour: str
    created_at: str
    updated_at: str
    ended_at: str | None
    starts_at: int | None
    ends_at: int | None


class Resource(WireRow):
    resource_id: int
    run_id: str
    module: str
    kind: str
    ref: str
    status: ResourceStatus
    word: str
    colour: str
    attempts: int
    away: int
    retry_at: str | None
    gave_up: bool
    lease_deadline: int | None
    lease_deadline_passed: bool
    revert: dict[str, Any] | None
    revert_omitted: int | None = None
    """Present only when the stored revert was too big to carry (``revert`` is then null)."""
    idempotency_key: str
    last_error: str | None
    created_at: str
    updated_at: str


class LogEntry(WireRow):
    entry_id: int
    run_id: str
    resource_id: int | None
    kind: str
    detail: Any
    detail_omitted: int | None = None
    at: str


class RunReply(LedgerReply):
    run: Run


class ResourceReply(LedgerReply):
    resource: Resource


class ExpiredReply(LedgerReply):
    expired: int


class OrphanedReply(LedgerReply):
    orphaned: int


class ConsoleReply(LedgerReply):
    run: Run
    resources: list[Resource]
    counts: dict[str, int]
    unresolved: int
    leases_overdue: int
    next: int | None


class LogReply(LedgerReply):
    run_id: str
    entries: list[LogEntry]
    next: int | None


class RunsReply(LedgerReply):
    runs: list[Run]
    more: bool
    next: str | None


class LeasesOverdueReply(LedgerReply):
    count: int
    resources: list[Resource]


class LiveReply(LedgerReply):
    resources: list[Resource]
    next: int | None


class LiveModulesReply(LedgerReply):
    modules: list[ModuleName]  # each becomes a subject token of ledger.expired/reconcile.<module>


class SettleReply(LedgerReply):
    settled: int


class CandidatesReply(LedgerReply):
    runs: list[str]


class ClaimReply(LedgerReply):
    resources: list[Resource]
    shard: str
    more: bool


class OutcomeConflict(WireRow):
    resource_id: int
    status: ResourceStatus


class OutcomesReply(LedgerReply):
    recorded: list[int]
    conflicts: list[OutcomeConflict]
    missing: list[int]


class WaitingRun(WireRow):
    run_id: str
    shard: str
    rows: int
    retry_at: str | None
    away: int
    waiting_since: str


class WaitingReply(LedgerReply):
    runs: list[WaitingRun]
    more: bool


def _ledger(subject: str, request: type[BaseModel], reply: type[BaseModel]) -> Contract:
    return Contract(subject, "ledger", request, reply, subjects.LEDGER_QUEUE)


CONTRACTS: tuple[Contract, ...] = (
    _ledger(subjects.LEDGER_RUN_CREATE, CreateRun, RunReply),
    _ledger(subjects.LEDGER_RUN_STATUS, SetRunStatus, RunReply),
    _ledger(subjects.LEDGER_RESOURCE_RESERVE, AddResource, ResourceReply),
    _ledger(subjects.LEDGER_RESOURCE_RECORD, AddResource, ResourceReply),
    _ledger(subjects.LEDGER_RESOURCE_CONFIRM, ResourceRef, ResourceReply),
    _ledger(subjects.LEDGER_RESOURCE_FAIL, FailResource, ResourceReply),
    _ledger(subjects.LEDGER_EXPIRED_PATTERN, Expired, ExpiredReply),
    _ledger(subjects.LEDGER_RECONCILE_PATTERN, Reconcile, OrphanedReply),
    _ledger(subjects.LEDGER_CONSOLE, Console, ConsoleReply),
    _ledger(subjects.LEDGER_LOG, RunLogPage, LogReply),
    _ledger(subjects.LEDGER_RUNS, ListRuns, RunsReply),
    _ledger(subjects.LEDGER_LEASES_OVERDUE, LeasesOverdue, LeasesOverdueReply),
    _ledger(subjects.LEDGER_LIVE, LiveRows, LiveReply),
    _ledger(subjects.LEDGER_LIVE_MODULES, LiveModules, LiveModulesReply),
    _ledger(subjects.LEDGER_SWEEP_SETTLE, Settle, SettleReply),
    _ledger(subjects.LEDGER_SWEEP_CANDIDATES, Candidates, CandidatesReply),
    _ledger(subjects.LEDGER_SWEEP_CLAIM, Claim, ClaimReply),
    _ledger(subjects.LEDGER_SWEEP_REVERTED, ResourceRef, ResourceReply),
    _ledger(subjects.LEDGER_SWEEP_DRIFTED, Drifted, ResourceReply),
    _ledger(subjects.LEDGER_SWEEP_FAILED, SweepFailed, ResourceReply),
    _ledger(subjects.LEDGER_SWEEP_OUTCOMES, SweepOutcomes, OutcomesReply),
    _ledger(subjects.LEDGER_SWEEP_FINISH, Finish, RunReply),
    _ledger(subjects.LEDGER_SWEEP_RETRY, RunRef, RunReply),
    _ledger(subjects.LEDGER_SWEEP_WAITING, Waiting, WaitingReply),
)
"""Every request/reply subject the ledger answers (``ledger.events.run.<runId>`` is an event
stream: docs/ledger.md, "Update events")."""
