"""Every service's answers to failures: a request that fails validation gets a 400 naming the
fields, anything unexpected a 500 (logged), and a service adds its own (the ledger's database
outage: 503). FastStream's exception middleware (shared/broker.py) and the ledger's own nats-py
subscriptions (``error_reply``) pick from the same table: the most specific type wins."""

from __future__ import annotations

import logging
from collections.abc import Callable
from http import HTTPStatus
from typing import Any

from pydantic import ValidationError

from shared import replies

log = logging.getLogger("shardbus.broker")

ErrorHandler = Callable[[Exception], dict[str, Any]]


def _internal_reply(exc: Exception) -> dict[str, Any]:
    log.error("request failed", exc_info=exc)
    return replies.fail(HTTPStatus.INTERNAL_SERVER_ERROR,
                        f"internal error ({type(exc).__name__}); the service logged the details")


def _validation_reply(exc: Exception) -> dict[str, Any]:
    """The reply to a request that failed validation (the middleware hands this handler
    ValidationErrors only: it picks a handler by the exception's type)."""
    if not isinstance(exc, ValidationError):
        return _internal_reply(exc)
    return replies.fail(replies.BAD_REQUEST, replies.describe_validation_error(exc))


def error_handlers(error_replies: dict[type[Exception], ErrorHandler] | None = None) -> dict[type[Exception],
                                                                                          ErrorHandler]:
    """Every service's answers to failures (a validation error: 400 naming the fields; anything
    unexpected: 500), with ``error_replies`` (a service's own, e.g. a database outage) added."""
    return {ValidationError: _validation_reply, Exception: _internal_reply, **(error_replies or {})}


def error_reply(handlers: dict[type[Exception], ErrorHandler], exc: Exception) -> dict[str, Any]:
    """The reply to ``exc`` from ``handlers`` (:func:`error_handlers`): the most specific type
    wins, as FastStream's exception middleware picks, for a service's own nats-py subscriptions."""
    for cls in type(exc).__mro__:
        handler = handlers.get(cls)
        if handler is not None:
            return handler(exc)
    return _internal_reply(exc)  # pragma: no cover - Exception is always in handlers
