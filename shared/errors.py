"""The one root of shardbus's own failures: :class:`ShardbusError` carries the HTTP-style
``status`` of the reply it becomes and the ``sentence`` a person acts on, and :meth:`ShardbusError.as_reply`
is the one place such a failure becomes the reply envelope (docs/contracts.md: every reply is
``{"status": N, …}``, a failure's with its ``error`` sentence).

Every refusal a service or a client raises derives from it — the ledger's, the installer's, the
cleanup's view of the ledger, and the NATS call failures of :mod:`shared.nats_calls` — so a
caller can read any of them the same way (``exc.status``, ``exc.sentence``), whatever the
service. ``str(exc)`` stays what each class has always said (a log line or a report may carry
it); the sentence is what a reply carries. docs/adr/0010-one-error-root-and-nats-calls.md says
why.
"""

from __future__ import annotations

from http import HTTPStatus
from typing import Any

from shared import replies


class ShardbusError(Exception):
    """A failure shardbus names: ``status`` (a class's own, unless one is given) and ``sentence``;
    ``str()`` of it is the sentence, or ``said`` where a class has always said something else."""

    status: int = HTTPStatus.INTERNAL_SERVER_ERROR
    """The reply's status: a class sets its own; an instance may carry another."""

    def __init__(self, sentence: str, status: int | None = None, *, said: str | None = None) -> None:
        super().__init__(sentence if said is None else said)
        self.sentence = sentence
        if status is not None:
            self.status = status

    def as_reply(self, **extra: Any) -> dict[str, Any]:
        """The reply that says this failure: ``{"status": status, "error": sentence, **extra}``."""
        return replies.fail(self.status, self.sentence, **extra)
