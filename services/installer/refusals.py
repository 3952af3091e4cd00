"""Why an install or removal was refused, as an HTTP-style status and a sentence to act on."""

from __future__ import annotations

BAD_INPUT = 400
"""A bad URL, manifest, hash or archive."""

NOT_INSTALLED = 404
"""Removing a module that is not installed."""

SITE_TAKEN = 409
"""Another module holds the site (or another install holds its lock for too long)."""

UPSTREAM_FAILED = 502
"""The source host was unreachable or answered 5xx, after retries."""


class Refused(Exception):
    """An install or removal that did not happen; nothing on the volume changed."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
