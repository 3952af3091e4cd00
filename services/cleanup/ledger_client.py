"""The ledger's requests the cleanup service makes (docs/contracts.md, "Ledger").

The cleanup service never touches the ledger's tables: every read and every status change
is a request to the ledger, which guards each transition. A ledger that is down or answers
an error raises :class:`LedgerError`, and so does NATS being away (503, like a ledger that
does not answer): the sweep stops there and the next one starts over.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from http import HTTPStatus
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from services.cleanup.requester import Requester
from shared import subjects
from shared.contracts import ledger as c
from shared.errors import ShardbusError
from shared.nats_calls import NatsAway, NoAnswer, NoResponders
from shared.replies import Reply, describe_validation_error

MAX_LIMIT = c.PAGE_LIMIT_MAX
"""The most runs or rows the ledger hands out per candidates or claim request."""

LIVE_LIMIT = c.LIVE_LIMIT_MAX
"""The most live rows of one module the ledger lists per page (its byte budget may list fewer)."""

ERROR_MAX = c.ERROR_MAX
"""The longest error sentence the ledger stores."""

ReplyModel = TypeVar("ReplyModel", bound=BaseModel)
RequestModel = TypeVar("RequestModel", bound=BaseModel)


class LedgerError(ShardbusError):
    """The ledger did not do what was asked on ``subject``: ``status`` (503 when unreachable) and
    ``sentence`` (why: the ledger's own error, or the cleanup's when the ledger could not say);
    ``str()`` names the subject and the status too."""

    def __init__(self, subject: str, status: int, sentence: str) -> None:
        super().__init__(sentence, status, said=f"{subject}: {status} {sentence}")
        self.subject = subject


NO_LEDGER = "no ledger is running"
"""The error of a request nobody answers (NATS's no responders)."""


class LedgerClient:
    """Typed calls to the ledger over a :class:`Requester`."""

    def __init__(self, requester: Requester, timeout_s: float) -> None:
        self.requester, self.timeout_s = requester, timeout_s

    async def call(self, subject: str, request: BaseModel) -> dict[str, Any]:
        """One request (a model of the ledger's contract, sent as its wire JSON); the reply when
        2xx, else :class:`LedgerError`."""
        payload = request.model_dump(mode="json", by_alias=True, exclude_none=True)
        try:
            data = await self.requester.request(subject, payload, self.timeout_s)
        except NoResponders:
            raise LedgerError(subject, HTTPStatus.SERVICE_UNAVAILABLE, NO_LEDGER) from None
        except NatsAway as exc:
            why = f"NATS is unreachable ({exc.reason}); the ledger could not be asked, retry shortly"
            raise LedgerError(subject, HTTPStatus.SERVICE_UNAVAILABLE, why) from None
        except NoAnswer:
            raise LedgerError(subject, HTTPStatus.SERVICE_UNAVAILABLE,
                              f"the ledger did not answer within {self.timeout_s:g} s") from None
        if not isinstance(data, dict) or isinstance(data.get("status"), bool) or (reply := _reply(data)) is None:
            raise LedgerError(subject, HTTPStatus.BAD_GATEWAY,
                              f"the ledger answered something unexpected: {str(data)[:200]}")
        if not reply.ok:
            raise LedgerError(subject, reply.status, str(reply.error or "no error given"))
        return data

    async def ask(self, subject: str, request: BaseModel, reply_model: type[ReplyModel]) -> ReplyModel:
        """:meth:`call`, the reply read with the contract's model (502 when it does not fit)."""
        data = await self.call(subject, request)
        try:
            return reply_model.model_validate(data)
        except ValidationError as exc:
            why = f"the ledger's reply does not fit its contract: {describe_validation_error(exc)}"
            raise LedgerError(subject, HTTPStatus.BAD_GATEWAY, why) from None

    @staticmethod
    def request(model: type[RequestModel], subject: str, **fields: Any) -> RequestModel:
        """The contract's request model of ``subject`` built from ``fields``; a field the ledger
        would refuse is refused here the same way (400 naming it), before anything is sent."""
        try:
            return model(**fields)
        except ValidationError as exc:
            raise LedgerError(subject, HTTPStatus.BAD_REQUEST, describe_validation_error(exc)) from None

    async def settle(self) -> int:
        subject = subjects.LEDGER_SWEEP_SETTLE
        return (await self.ask(subject, c.Settle(), c.SettleReply)).settled

    async def candidates(self, max_attempts: int, limit: int) -> list[str]:
        subject = subjects.LEDGER_SWEEP_CANDIDATES
        request = self.request(c.Candidates, subject, max_attempts=max_attempts, limit=min(limit, MAX_LIMIT))
        return (await self.ask(subject, request, c.CandidatesReply)).runs

    async def claim(self, run_id: str, max_attempts: int, limit: int,
                    claim_timeout_s: float) -> tuple[list[dict[str, Any]], str, bool]:
        """Rows now ``reverting`` for this sweeper, the run's shard, and whether claimable rows
        were left (the ledger bounds a claim by bytes as well as by ``limit``: claim again). The
        rows stay as sent: the sweep checks each one, so one malformed row fails alone."""
        subject = subjects.LEDGER_SWEEP_CLAIM
        reply = await self.call(subject, self.request(c.Claim, subject, run_id=run_id, max_attempts=max_attempts,
                                                      limit=limit, claim_timeout_s=float(claim_timeout_s)))
        rows, shard = list(reply.get("resources", [])), reply.get("shard")
        if rows and not isinstance(shard, str):
            raise LedgerError(subject, HTTPStatus.BAD_GATEWAY,
                              "the ledger's claim named no shard for the rows it handed out")
        more = reply.get("more")
        if not isinstance(more, bool):  # a ledger from before claims were paged: a full batch may have more
            more = len(rows) >= limit
        return rows, shard or "", more

    async def outcomes(self, outcomes: list[dict[str, Any]], away_backoff_s: float = 2.0,
                       away_backoff_max_s: float = 60.0) -> c.OutcomesReply:
        """Record give-back outcomes (``resourceId``, ``verdict``, ``error``) in one request, with
        the back-off of rows whose give-back met nobody (``away``: the first wait, doubled per
        miss in a row up to the cap); the reply says which were ``recorded``, which were
        ``conflicts`` and which ``missing``."""
        subject = subjects.LEDGER_SWEEP_OUTCOMES
        cut = [{**o, "error": o["error"][:ERROR_MAX]} if o.get("error") is not None else o for o in outcomes]
        request = self.request(c.SweepOutcomes, subject, outcomes=cut,
                               away_backoff_s=float(away_backoff_s), away_backoff_max_s=float(away_backoff_max_s))
        return await self.ask(subject, request, c.OutcomesReply)

    async def finish(self, run_id: str, max_attempts: int, summary: dict[str, Any]) -> c.Run:
        subject = subjects.LEDGER_SWEEP_FINISH
        request = self.request(c.Finish, subject, run_id=run_id, max_attempts=max_attempts, summary=summary)
        return (await self.ask(subject, request, c.RunReply)).run

    async def retry(self, run_id: str) -> c.Run:
        subject = subjects.LEDGER_SWEEP_RETRY
        return (await self.ask(subject, self.request(c.RunRef, subject, run_id=run_id), c.RunReply)).run

    async def waiting_longer_than(self, seconds: float, limit: int = MAX_LIMIT) -> c.WaitingReply:
        """Runs waiting for their shard or module longer than ``seconds`` (at most ``limit``;
        ``more``: there are more)."""
        subject = subjects.LEDGER_SWEEP_WAITING
        request = self.request(c.Waiting, subject, limit=limit, longer_than_s=float(seconds))
        return await self.ask(subject, request, c.WaitingReply)

    async def console(self, run_id: str, after: int | None = None, limit: int | None = None) -> dict[str, Any]:
        """One page of the run's console: the run, the counts, and at most ``limit`` of its rows
        with an id above ``after`` (the page's ``next`` is the ``after`` of the page that follows)."""
        subject = subjects.LEDGER_CONSOLE
        fields: dict[str, Any] = {"run_id": run_id, "after": after}
        if limit is not None:
            fields["limit"] = limit
        return await self.call(subject, self.request(c.Console, subject, **fields))

    async def live_pages(self, module: str) -> AsyncIterator[list[dict[str, Any]]]:
        """The module's live rows, page after page (each page within one NATS message)."""
        subject, after = subjects.LEDGER_LIVE, None
        while True:
            reply = await self.call(subject, self.request(c.LiveRows, subject, module=module, limit=LIVE_LIMIT,
                                                          after=after))
            rows = reply.get("resources")
            if not isinstance(rows, list):
                raise LedgerError(subject, HTTPStatus.BAD_GATEWAY,
                                  f"the ledger answered without a list of rows: {str(reply)[:200]}")
            yield rows
            following = reply.get("next")
            if following is None or not rows:
                return
            if not isinstance(following, int) or isinstance(following, bool) or (after is not None
                                                                                  and following <= after):
                raise LedgerError(subject, HTTPStatus.BAD_GATEWAY,
                                  f"the ledger's live rows named no usable next page: {following!r}")
            after = following

    async def live(self, module: str) -> list[dict[str, Any]]:
        """Every live row of the module (all pages)."""
        return [row async for page in self.live_pages(module) for row in page]

    async def live_modules(self) -> list[str]:
        """Every module owning a live (pending or confirmed) row."""
        subject = subjects.LEDGER_LIVE_MODULES
        return (await self.ask(subject, c.LiveModules(limit=LIVE_LIMIT), c.LiveModulesReply)).modules

    async def expired(self, module: str, kind: str, ref: str) -> int:
        """The game ended ``module``'s (kind, ref) at its deadline; how many rows became ``expired``."""
        subject = subjects.ledger_expired(module)
        return (await self.ask(subject, self.request(c.Expired, subject, kind=kind, ref=ref), c.ExpiredReply)).expired

    async def reconcile(self, module: str, run_id: str, kind: str | None, present: list[str]) -> int:
        subject = subjects.ledger_reconcile(module)
        request = self.request(c.Reconcile, subject, run_id=run_id, kind=kind, present=present)
        return (await self.ask(subject, request, c.OrphanedReply)).orphaned


def _reply(data: dict[str, Any]) -> Reply | None:
    """``data`` read as a reply envelope, or None when it is not one."""
    try:
        return Reply.from_dict(data)
    except ValidationError:
        return None
