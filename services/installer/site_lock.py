"""The site lock: one install or removal at a time across every installer replica.

It lives in a JetStream key-value bucket, not in process memory. Taking it is a
compare-and-set create of the key ``site.<site>`` (only one replica's create can succeed);
the holder renews it with compare-and-set updates, and the bucket's max age expires it if
the holder dies, so a crashed replica cannot block the site for ever. While holding it, a
replica reads the modules directory and decides (409, upgrade, or install), so two
replicas can never both decide the site is free.

NATS away (stopped, restarting, JetStream without a leader: ``shared.nats_calls.is_away``, which
counts no answer in time and no JetStream answering as away) while a lock is wanted answers
503 ("try again shortly") before anything changes; while one is held, the holder keeps
renewing until its lease runs out and checks it is still its own before swapping anything in
(:meth:`Lease.confirm`).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import socket
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from http import HTTPStatus

from nats.js import JetStreamContext
from nats.js.api import KeyValueConfig
from nats.js.errors import (
    BadRequestError,
    BucketNotFoundError,
    KeyNotFoundError,
    KeyWrongLastSequenceError,
    NotFoundError,
)
from nats.js.kv import KeyValue

from services.installer.refusals import SITE_TAKEN, Refused
from shared.errors import ShardbusError
from shared.nats_calls import is_away

log = logging.getLogger("shardbus.installer.lock")

RENEWALS_PER_LEASE = 3
"""How many times a holder renews the lock within one lease."""

MAX_POLL_S = 0.1
"""Longest pause between two tries of a waiter (a try is one small KV request)."""

NATS_AWAY = HTTPStatus.SERVICE_UNAVAILABLE
"""A lock that cannot be taken because NATS (or its JetStream) is away: nothing changed."""


def _unavailable(exc: BaseException) -> Refused:
    return Refused(NATS_AWAY, f"the site lock cannot be taken: NATS is unreachable ({type(exc).__name__}); "
                              "nothing was changed, try again shortly")


async def open_bucket(js: JetStreamContext, bucket: str, lease_s: float, replicas: int = 1) -> KeyValue:
    """The lock bucket, created (history 1, max age ``lease_s``, ``replicas`` copies on a
    NATS cluster) if no replica has yet."""
    try:
        return await js.key_value(bucket)
    except (BucketNotFoundError, NotFoundError):
        pass
    try:
        return await js.create_key_value(KeyValueConfig(bucket=bucket, history=1, ttl=lease_s,
                                                       replicas=replicas))
    except BadRequestError:  # another replica created it first, maybe with other settings
        return await js.key_value(bucket)


class LockLost(ShardbusError):
    """The lease expired (the holder stalled) and another replica may hold the site now: nothing
    was changed (the install answers 503)."""

    status = HTTPStatus.SERVICE_UNAVAILABLE


class Lease:
    """A held site lock, renewed in the background until released."""

    def __init__(self, kv: KeyValue, key: str, value: bytes, revision: int, renew_every_s: float) -> None:
        self._kv, self._key, self._value = kv, key, value
        self.revision = revision
        self.lost = False
        self._task = asyncio.create_task(self._keep(renew_every_s))

    async def _keep(self, every_s: float) -> None:
        while not self.lost:
            await asyncio.sleep(every_s)
            await self.renew()

    async def renew(self) -> None:
        """Extend the lease now (compare-and-set), or mark it lost."""
        try:
            self.revision = await self._kv.update(self._key, self._value, last=self.revision)
        except KeyWrongLastSequenceError:
            self.lost = True
        except Exception as exc:  # noqa: BLE001 — NATS briefly away: keep trying until the lease runs out
            log.warning("could not renew the site lock", extra={"reason": repr(exc)})

    async def confirm(self) -> None:
        """Raise :class:`LockLost` unless the lease is provably still ours (checked just before a
        swap): a renewal that fails for any reason, e.g. NATS away, counts as lost."""
        try:
            self.revision = await self._kv.update(self._key, self._value, last=self.revision)
        except KeyWrongLastSequenceError:
            self.lost = True
            raise LockLost("the site lock expired while this install was running") from None
        except Exception as exc:  # noqa: BLE001 — any failure to renew means the lease is not provably ours
            raise LockLost(f"the site lock could not be confirmed ({type(exc).__name__})") from None

    async def release(self) -> None:
        self._task.cancel()
        if self.lost:
            return
        try:
            await self._kv.delete(self._key, last=self.revision)
        except Exception as exc:  # noqa: BLE001 — it expires by itself
            log.warning("could not release the site lock", extra={"reason": repr(exc)})


class SiteLock:
    """Takes the lock of one site, waiting up to ``wait_s`` for another holder to finish."""

    def __init__(self, kv: KeyValue, site: str, *, wait_s: float, lease_s: float) -> None:
        self.kv, self.key = kv, f"site.{site}"
        self.wait_s, self.lease_s = wait_s, lease_s

    @asynccontextmanager
    async def hold(self, purpose: str) -> AsyncIterator[Lease]:
        """Hold the site lock for ``purpose`` (e.g. ``install uo-events``); 409 if it stays busy,
        503 if NATS is away."""
        try:
            status = await self.kv.status()
        except Exception as exc:
            if is_away(exc):
                raise _unavailable(exc) from exc
            raise
        lease_s = status.ttl or self.lease_s
        value = json.dumps({"holder": f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}",
                            "purpose": purpose, "since": time.time()}).encode()
        deadline, pause = time.monotonic() + self.wait_s, 0.02
        while True:
            try:
                revision = await self.kv.create(self.key, value)
                break
            except (KeyWrongLastSequenceError, KeyNotFoundError):
                if time.monotonic() >= deadline:
                    raise Refused(SITE_TAKEN, f"another install or removal ({await self._holder()}) is "
                                              "still running on this site; try again when it is done") from None
                await asyncio.sleep(pause)
                pause = min(pause * 2, MAX_POLL_S)
            except Exception as exc:
                if is_away(exc):
                    raise _unavailable(exc) from exc
                raise
        lease = Lease(self.kv, self.key, value, revision, lease_s / RENEWALS_PER_LEASE)
        try:
            yield lease
        finally:
            await lease.release()

    async def _holder(self) -> str:
        try:
            entry = await self.kv.get(self.key)
            purpose = json.loads(entry.value or b"{}").get("purpose", "unknown")
            return purpose if isinstance(purpose, str) else "unknown"
        except Exception:  # noqa: BLE001 — only a detail of a 409's sentence: never worth failing it
            return "unknown"
