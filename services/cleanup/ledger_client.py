"""The ledger's requests the cleanup service makes (docs/contracts.md, "Ledger").

The cleanup service never touches the ledger's tables: every read and every status change
is a request to the ledger, which guards each transition. A ledger that is down or answers
an error raises :class:`LedgerError`, and so does NATS being away (503, like a ledger that
does not answer): the sweep stops there and the next one starts over.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from services.cleanup.port import NoAnswer, NoResponder, Port, Unreachable
from shared import subjects

MAX_LIMIT = 1000
"""The most runs or rows the ledger hands out per candidates or claim request."""

LIVE_LIMIT = 10_000
"""The most live rows of one module the ledger lists per page (its byte budget may list fewer)."""

ERROR_MAX = 1000
"""The longest error sentence the ledger stores."""


class LedgerError(Exception):
    """The ledger did not do what was asked: ``status`` (503 when unreachable) and why."""

    def __init__(self, subject: str, status: int, error: str) -> None:
        super().__init__(f"{subject}: {status} {error}")
        self.subject, self.status, self.error = subject, status, error


NO_LEDGER = "no ledger is running"
"""The error of a request nobody answers (NATS's no responders)."""


class LedgerClient:
    """Typed calls to the ledger over a :class:`Port`."""

    def __init__(self, port: Port, timeout_s: float) -> None:
        self.port, self.timeout_s = port, timeout_s

    async def call(self, subject: str, payload: dict[str, Any]) -> dict[str, Any]:
        """One request; the reply when 2xx, else :class:`LedgerError`."""
        try:
            reply = await self.port.request(subject, payload, self.timeout_s)
        except NoResponder:
            raise LedgerError(subject, 503, NO_LEDGER) from None
        except Unreachable as exc:
            raise LedgerError(subject, 503, f"NATS is unreachable ({exc.reason}); the ledger could not be "
                                            "asked, retry shortly") from None
        except NoAnswer:
            raise LedgerError(subject, 503, f"the ledger did not answer within {self.timeout_s:g} s") from None
        if not isinstance(reply, dict) or not isinstance(reply.get("status"), int):
            raise LedgerError(subject, 502, f"the ledger answered something unexpected: {str(reply)[:200]}")
        if not 200 <= reply["status"] < 300:
            raise LedgerError(subject, reply["status"], str(reply.get("error") or "no error given"))
        return reply

    async def settle(self) -> int:
        return int((await self.call(subjects.LEDGER_SWEEP_SETTLE, {})).get("settled", 0))

    async def candidates(self, max_attempts: int, limit: int) -> list[str]:
        reply = await self.call(subjects.LEDGER_SWEEP_CANDIDATES, {"maxAttempts": max_attempts,
                                                                 "limit": min(limit, MAX_LIMIT)})
        return [str(run) for run in reply.get("runs", [])]

    async def claim(self, run_id: str, max_attempts: int, limit: int,
                    claim_timeout_s: float) -> tuple[list[dict], str, bool]:
        """Rows now ``reverting`` for this sweeper, the run's shard, and whether claimable rows
        were left (the ledger bounds a claim by bytes as well as by ``limit``: claim again)."""
        subject = subjects.LEDGER_SWEEP_CLAIM
        reply = await self.call(subject, {"runId": run_id, "maxAttempts": max_attempts, "limit": limit,
                                          "claimTimeoutS": claim_timeout_s})
        rows, shard = list(reply.get("resources", [])), reply.get("shard")
        if rows and not isinstance(shard, str):
            raise LedgerError(subject, 502, "the ledger's claim named no shard for the rows it handed out")
        more = reply.get("more")
        if not isinstance(more, bool):  # a ledger from before claims were paged: a full batch may have more
            more = len(rows) >= limit
        return rows, shard or "", more

    async def outcomes(self, outcomes: list[dict[str, Any]], away_backoff_s: float = 2.0,
                       away_backoff_max_s: float = 60.0) -> dict[str, Any]:
        """Record give-back outcomes (``resourceId``, ``verdict``, ``error``) in one request, with
        the back-off of rows whose give-back met nobody (``away``: the first wait, doubled per
        miss in a row up to the cap); the reply says which were ``recorded``, which were
        ``conflicts`` and which ``missing``."""
        cut = [{**o, "error": o["error"][:ERROR_MAX]} if o.get("error") is not None else o for o in outcomes]
        return await self.call(subjects.LEDGER_SWEEP_OUTCOMES, {"outcomes": cut, "awayBackoffS": away_backoff_s,
                                                                "awayBackoffMaxS": away_backoff_max_s})

    async def finish(self, run_id: str, max_attempts: int, summary: dict[str, Any]) -> dict[str, Any]:
        reply = await self.call(subjects.LEDGER_SWEEP_FINISH, {"runId": run_id, "maxAttempts": max_attempts,
                                                        "summary": summary})
        return dict(reply.get("run") or {})

    async def retry(self, run_id: str) -> dict[str, Any]:
        return dict((await self.call(subjects.LEDGER_SWEEP_RETRY, {"runId": run_id})).get("run") or {})

    async def console(self, run_id: str, after: int | None = None, limit: int | None = None) -> dict[str, Any]:
        """One page of the run's console: the run, the counts, and at most ``limit`` of its rows
        with an id above ``after`` (the page's ``next`` is the ``after`` of the page that follows)."""
        payload: dict[str, Any] = {"runId": run_id}
        if after is not None:
            payload["after"] = after
        if limit is not None:
            payload["limit"] = limit
        return await self.call(subjects.LEDGER_CONSOLE, payload)

    async def live_pages(self, module: str) -> AsyncIterator[list[dict]]:
        """The module's live rows, page after page (each page within one NATS message)."""
        subject, after = subjects.LEDGER_LIVE, None
        while True:
            payload: dict[str, Any] = {"module": module, "limit": LIVE_LIMIT}
            if after is not None:
                payload["after"] = after
            reply = await self.call(subject, payload)
            rows = reply.get("resources")
            if not isinstance(rows, list):
                raise LedgerError(subject, 502, f"the ledger answered without a list of rows: {str(reply)[:200]}")
            yield rows
            following = reply.get("next")
            if following is None or not rows:
                return
            if not isinstance(following, int) or isinstance(following, bool) or (after is not None
                                                                                  and following <= after):
                raise LedgerError(subject, 502, f"the ledger's live rows named no usable next page: {following!r}")
            after = following

    async def live(self, module: str) -> list[dict]:
        """Every live row of the module (all pages)."""
        return [row async for page in self.live_pages(module) for row in page]

    async def live_modules(self) -> list[str]:
        """Every module owning a live (pending or confirmed) row."""
        subject = subjects.LEDGER_LIVE_MODULES
        modules = (await self.call(subject, {"limit": LIVE_LIMIT})).get("modules")
        if not isinstance(modules, list) or not all(isinstance(m, str) for m in modules):
            raise LedgerError(subject, 502,
                              f"the ledger answered without a list of module names: {str(modules)[:200]}")
        return modules

    async def expired(self, module: str, kind: str, ref: str) -> int:
        """The game ended ``module``'s (kind, ref) at its deadline; how many rows became ``expired``."""
        return int((await self.call(subjects.ledger_expired(module), {"kind": kind, "ref": ref})).get("expired", 0))

    async def reconcile(self, module: str, run_id: str, kind: str | None, present: list[str]) -> int:
        payload: dict[str, Any] = {"runId": run_id, "present": present}
        if kind is not None:
            payload["kind"] = kind
        return int((await self.call(subjects.ledger_reconcile(module), payload)).get("orphaned", 0))
