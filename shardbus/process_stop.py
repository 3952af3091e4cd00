"""How long a service process (``shardbus run``) may take to stop, and the timer that holds it
to that: read by ``shardbus run`` (``shardbus/cli.py``), which arms the timer, and by ``shardbus
up`` (``shardbus/stack.py``), which gives each child that long before a SIGKILL."""

from __future__ import annotations

import logging
import os
import threading

STOP_TIMEOUT_S = 8.0
"""A service ends at most this long after SIGTERM (or SIGINT), NATS away or not: its stop
(in-flight requests get ``shared.broker.STOP_GRACE_S``, then NATS is drained, or closed when it
is away) normally takes well under it; past it the process exits anyway. Below the 10 s that
compose (``stop_grace_period``), ``shardbus up`` and the tests give before a SIGKILL."""


class StopDeadline:
    """Once a stop is asked for (SIGTERM, SIGINT), the process ends within ``timeout_s`` even if
    the orderly stop hangs: nats-py on Python 3.11 can swallow a task's cancellation while it
    reconnects (``asyncio.wait_for`` returns a connect attempt that finished in the same
    instant), leaving a reconnect loop that outlives ``asyncio.run``. A daemon timer thread
    logs one line and ``os._exit``s half a second before ``timeout_s`` (the time to exit); it
    cannot be held up by the event loop."""

    EXIT_MARGIN_S = 0.5

    def __init__(self, service: str, timeout_s: float = STOP_TIMEOUT_S) -> None:
        self.service, self.timeout_s = service, timeout_s
        self._timer: threading.Timer | None = None

    @property
    def armed(self) -> bool:
        """Whether a stop was asked for."""
        return self._timer is not None

    def arm(self) -> None:
        if self._timer is None:
            self._timer = threading.Timer(self.timeout_s - self.EXIT_MARGIN_S, self._expire)
            self._timer.daemon = True
            self._timer.start()

    def disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()

    def _expire(self) -> None:
        logging.getLogger("shardbus").warning(
            "stop did not finish in time; exiting anyway", extra={"stop_timeout_s": self.timeout_s})
        for handler in logging.getLogger().handlers:
            handler.flush()
        os._exit(0)
