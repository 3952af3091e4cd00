"""The site lock in a NATS KV bucket: one holder at a time, a busy site answered with 409
naming what holds it, and a holder that died is outlived by its lease."""

from __future__ import annotations

import asyncio
import time

import pytest

from services.installer.refusals import Refused
from services.installer.site_lock import LockLost, SiteLock, open_bucket


@pytest.fixture
async def bucket(nc, unique):
    js = nc.jetstream()
    kv = await open_bucket(js, f"T_LOCK_{unique}", lease_s=1.0)
    yield kv
    await js.delete_key_value(f"T_LOCK_{unique}")


async def test_a_held_site_makes_another_holder_wait_then_409_naming_the_holder(bucket, unique):
    first = SiteLock(bucket, unique, wait_s=5, lease_s=1)
    second = SiteLock(bucket, unique, wait_s=0.3, lease_s=1)
    async with first.hold("install uo-events 1.4.0"):
        with pytest.raises(Refused) as refused:
            async with second.hold("install uo-vendors 1.0.0"):
                pass
    assert refused.value.status == 409 and "install uo-events 1.4.0" in refused.value.sentence


async def test_the_lock_is_free_again_once_released(bucket, unique):
    lock = SiteLock(bucket, unique, wait_s=0.5, lease_s=1)
    for _ in range(3):
        async with lock.hold("remove x"):
            pass


async def test_a_holder_renews_its_lease_while_working_longer_than_the_lease(bucket, unique):
    holder = SiteLock(bucket, unique, wait_s=1, lease_s=1)
    other = SiteLock(bucket, unique, wait_s=0.2, lease_s=1)
    async with holder.hold("install slow") as lease:
        await asyncio.sleep(2.0)
        with pytest.raises(Refused):
            async with other.hold("install other"):
                pass
        await lease.confirm()


async def test_a_holder_that_died_is_outlived_by_its_lease(bucket, unique):
    dead = SiteLock(bucket, unique, wait_s=1, lease_s=1)
    holding = dead.hold("install crashed")
    lease = await holding.__aenter__()
    lease._task.cancel()  # the replica stops renewing, as a killed process would
    started = time.monotonic()
    async with SiteLock(bucket, unique, wait_s=10, lease_s=1).hold("install next"):
        waited = time.monotonic() - started
    assert 0.3 < waited < 8
    with pytest.raises(LockLost):  # had it only stalled, it finds out before swapping anything in
        await lease.confirm()
    await holding.__aexit__(None, None, None)
