"""Connecting to NATS: named connections that reconnect for ever, with back-off.

nats-py waits a fixed ``reconnect_time_wait`` between attempts. Its
``reconnect_to_server_handler`` hook lets us pick the least-tried server and a delay that
doubles with each failed attempt, capped — so a long outage is not a busy loop and a short
one is bridged quickly. FastStream's ``NatsBroker`` takes the same options.

A reconnecting client still closes *for good* on some server errors (nats-py treats any
``-ERR`` but a permissions violation or a stale connection as fatal: a publish over
``max_payload``, an authorization revoked by a reload…). A service whose connection is gone
for good answers nothing, yet its process lives on, so no supervisor restarts it.
:class:`ClosedForGood` is the ``closed_cb`` that turns such a close into the end of the
process (``shared/broker.py`` arms it while a service runs).
"""

from __future__ import annotations

import logging
import os
import re
import socket
import threading
from collections.abc import Callable, Sequence
from typing import Any
from urllib.parse import urlsplit

import nats
from nats.aio.client import Client

from shared import natspy_internals

log = logging.getLogger("shardbus.nats")

FATAL_CLOSE_EXIT_CODE = 75
"""How a service exits when its NATS connection closed for good (EX_TEMPFAIL: try again —
compose's ``restart: unless-stopped`` and ``shardbus up`` restart it)."""

FATAL_CLOSE_STOP_S = 10.0
"""How long an orderly stop after such a close may take before the process ends anyway."""


def connection_name(service: str) -> str:
    """A name that tells operators which process holds a connection (monitoring, ``$SYS``)."""
    return f"shardbus-{service}@{socket.gethostname()}:{os.getpid()}"


MAX_DOUBLINGS = 1023
"""The most times :class:`BackOff` doubles its first wait (``2.0 ** 1023`` is a float's largest power of two)."""


class BackOff:
    """Picks the least-tried server and waits ``first · 2^(tries-1)`` seconds, at most ``cap``."""

    def __init__(self, first_s: float, cap_s: float) -> None:
        if first_s <= 0 or cap_s < first_s:
            raise ValueError(f"back-off needs 0 < first ({first_s}) <= cap ({cap_s})")
        self.first_s, self.cap_s = first_s, cap_s

    def delay(self, tries: int) -> float:
        """Seconds to wait before the next attempt at a server tried ``tries`` times."""
        # 2.0 ** 1024 overflows a float; the cap is reached long before, so the exponent stops there.
        return min(self.cap_s, self.first_s * 2.0 ** min(max(0, tries - 1), MAX_DOUBLINGS))

    def __call__(self, servers: list[Any], _info: dict[str, Any]) -> tuple[Any, float]:
        server = min(servers, key=lambda s: s.reconnects)
        return server, self.delay(server.reconnects)


def inbox_prefix(servers: Sequence[str] | str) -> str:
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


PING_INTERVAL_S = 2.0
"""How often a connection pings its server unless told otherwise (``SHARDBUS_NATS_PING_INTERVAL_S``)."""

MAX_OUTSTANDING_PINGS = 2
"""Unanswered pings before the connection is dropped as stale (``SHARDBUS_NATS_MAX_OUTSTANDING_PINGS``)."""


def connect_options(service: str, first_wait_s: float = 1.0, max_wait_s: float = 10.0,
                    servers: Sequence[str] | str = (), *, ping_interval_s: float = PING_INTERVAL_S,
                    max_outstanding_pings: int = MAX_OUTSTANDING_PINGS) -> dict[str, Any]:
    """Options for ``nats.connect`` or ``NatsBroker``: named, reconnecting for ever with back-off,
    hearing replies under the user's own inbox prefix (see :func:`inbox_prefix`), and noticing a
    silent server within ``ping_interval_s`` × (``max_outstanding_pings`` + 1) — nats-py's 120 s
    default kept a connection to a node cut off from the network "connected" for minutes, so the
    client never moved to the healthy nodes listed (docs/reliability.md, "A silent NATS link"; issue 36)."""
    natspy_internals.bound_socket_close()  # else the reconnect waits for the dead socket's close
    return {
        "name": connection_name(service),
        "allow_reconnect": True,
        "max_reconnect_attempts": -1,
        "reconnect_time_wait": first_wait_s,
        "reconnect_to_server_handler": BackOff(first_wait_s, max_wait_s),
        "inbox_prefix": inbox_prefix(servers),
        "ping_interval": ping_interval_s,
        "max_outstanding_pings": max_outstanding_pings,
    }


async def connect(servers: list[str] | str, service: str, *, first_wait_s: float = 1.0,
                  max_wait_s: float = 10.0, **extra: Any) -> Client:
    """A nats-py connection named after ``service`` that reconnects for ever."""
    options = connect_options(service, first_wait_s, max_wait_s, servers)
    options.update(extra)
    return await nats.connect(servers, **options)


class ClosedForGood:
    """The nats-py ``closed_cb`` (:meth:`on_closed`) of a service's connection: while *armed*
    (the service runs and is not stopping), a close means the client gave up for good, which is
    fatal.

    When it fires it logs one line (CRITICAL, with the client's last error as ``reason``) and
    calls ``on_fatal`` (the app stops in order and exits with :data:`FATAL_CLOSE_EXIT_CODE`);
    whatever happens then, the process ends within :data:`FATAL_CLOSE_STOP_S`. Disarmed (a
    stop under way, or a connection no app runs, as in tests), a close is nobody's business."""

    def __init__(self, service: str, reason: Callable[[], object] | None = None) -> None:
        self.service = service
        self.reason = reason or (lambda: None)
        self.on_fatal: Callable[[int], None] | None = None
        self.fired = False
        self.watchdog: threading.Timer | None = None
        """Ends the process if the orderly stop after a fatal close takes too long."""

    @property
    def armed(self) -> bool:
        return self.on_fatal is not None

    def arm(self, on_fatal: Callable[[int], None]) -> None:
        """From now on a close ends the process: ``on_fatal(exit_code)`` is asked to stop it."""
        self.on_fatal = on_fatal

    def disarm(self) -> None:
        """The service is stopping (or not run by an app): a close is expected."""
        self.on_fatal = None

    async def on_closed(self) -> None:
        """The ``closed_cb`` (nats-py wants a coroutine function, not a callable object)."""
        on_fatal = self.on_fatal
        if on_fatal is None or self.fired:
            return
        self.fired = True
        try:
            reason = self.reason()
        except Exception as exc:  # noqa: BLE001 — the reason is for the log line only
            reason = exc
        log.critical("NATS connection closed for good; exiting so the supervisor restarts the service",
                     extra={"reason": repr(reason) if reason is not None else "unknown",
                            "exit_code": FATAL_CLOSE_EXIT_CODE})
        for handler in logging.getLogger().handlers:
            handler.flush()
        self.watchdog = threading.Timer(FATAL_CLOSE_STOP_S, os._exit, args=(FATAL_CLOSE_EXIT_CODE,))
        self.watchdog.daemon = True
        self.watchdog.start()
        try:
            on_fatal(FATAL_CLOSE_EXIT_CODE)
        except Exception:  # noqa: BLE001 — nothing may keep a dead service alive
            os._exit(FATAL_CLOSE_EXIT_CODE)
