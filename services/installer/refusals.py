"""Why an install or removal was refused, as an HTTP status and a sentence to act on."""

from __future__ import annotations

from http import HTTPStatus

from shared.errors import ShardbusError

BAD_INPUT = HTTPStatus.BAD_REQUEST
"""A bad URL, manifest, hash or archive."""

NOT_INSTALLED = HTTPStatus.NOT_FOUND
"""Removing a module that is not installed."""

SITE_TAKEN = HTTPStatus.CONFLICT
"""Another module holds the site (or another install holds its lock for too long)."""

UPSTREAM_FAILED = HTTPStatus.BAD_GATEWAY
"""The source host was unreachable or answered 5xx, after retries."""


class Refused(ShardbusError):
    """An install or removal that did not happen; nothing on the volume changed: ``status`` and
    ``sentence`` (the reply's ``error``)."""

    def __init__(self, status: HTTPStatus, sentence: str) -> None:
        super().__init__(sentence, status)
