"""Connecting to NATS: named connections that reconnect for ever, with back-off.

nats-py waits a fixed ``reconnect_time_wait`` between attempts. Its
``reconnect_to_server_handler`` hook lets us pick the least-tried server and a delay that
doubles with each failed attempt, capped — so a long outage is not a busy loop and a short
one is bridged quickly. FastStream's ``NatsBroker`` takes the same options.
"""

from __future__ import annotations

import os
import re
import socket
from typing import Any
from urllib.parse import urlsplit

import nats
from nats.aio.client import Client


def connection_name(service: str) -> str:
    """A name that tells operators which process holds a connection (monitoring, ``$SYS``)."""
    return f"shardbus-{service}@{socket.gethostname()}:{os.getpid()}"


class BackOff:
    """Picks the least-tried server and waits ``first · 2^(tries-1)`` seconds, at most ``cap``."""

    def __init__(self, first_s: float, cap_s: float) -> None:
        if first_s <= 0 or cap_s < first_s:
            raise ValueError(f"back-off needs 0 < first ({first_s}) <= cap ({cap_s})")
        self.first_s, self.cap_s = first_s, cap_s

    def delay(self, tries: int) -> float:
        """Seconds to wait before the next attempt at a server tried ``tries`` times."""
        return min(self.cap_s, self.first_s * (2 ** max(0, tries - 1)))

    def __call__(self, servers: list[Any], _info: dict[str, Any]) -> tuple[Any, float]:
        server = min(servers, key=lambda s: s.reconnects)
        return server, self.delay(server.reconnects)


def inbox_prefix(servers: list[str] | str) -> str:
    """Where a connection hears its replies: ``_INBOX_<user>`` when the URL names a user
    (``nats://gateway:…@nats:4222`` -> ``_INBOX_gateway``), else NATS's shared ``_INBOX``.
    deploy/nats/nats.conf lets each user subscribe under its own prefix only, so no other user
    can hear its replies (docs/security.md)."""
    for url in [servers] if isinstance(servers, str) else servers:
        url = url.strip()
        user = urlsplit(url if "://" in url else f"nats://{url}").username
        if user and re.fullmatch(r"[A-Za-z0-9_-]+", user):
            return f"_INBOX_{user}"
    return "_INBOX"


def connect_options(service: str, first_wait_s: float = 1.0, max_wait_s: float = 10.0,
                    servers: list[str] | str = ()) -> dict[str, Any]:
    """Options for ``nats.connect`` or ``NatsBroker``: named, reconnecting for ever with back-off,
    hearing replies under the user's own inbox prefix (see :func:`inbox_prefix`)."""
    return {
        "name": connection_name(service),
        "allow_reconnect": True,
        "max_reconnect_attempts": -1,
        "reconnect_time_wait": first_wait_s,
        "reconnect_to_server_handler": BackOff(first_wait_s, max_wait_s),
        "inbox_prefix": inbox_prefix(servers),
    }


async def connect(servers: list[str] | str, service: str, *, first_wait_s: float = 1.0,
                  max_wait_s: float = 10.0, **extra: Any) -> Client:
    """A nats-py connection named after ``service`` that reconnects for ever."""
    options = connect_options(service, first_wait_s, max_wait_s, servers)
    options.update(extra)
    return await nats.connect(servers, **options)
