"""What the model test drives the real ledger with: an event loop of its own thread (the
state machine's rules are synchronous), a NATS client, the ledger's replicas as processes (so a
rule can SIGKILL one), the history of every request and reply, and the readers of what the
ledger says at the end (console, log, the LEDGER_EVENTS stream)."""

from __future__ import annotations

import asyncio
import itertools
import json
import shutil
import signal
import tempfile
import threading
import time
from collections.abc import Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import nats
import nats.errors
import nats.js.errors

from shardbus import embedded
from shared import subjects
from tests.model.reference import Model, Refused, check
from tests.processes import ServiceProcess, ServiceProcesses

OP_SUBJECTS = {
    "create": subjects.LEDGER_RUN_CREATE, "run_status": subjects.LEDGER_RUN_STATUS,
    "reserve": subjects.LEDGER_RESOURCE_RESERVE, "record": subjects.LEDGER_RESOURCE_RECORD,
    "confirm": subjects.LEDGER_RESOURCE_CONFIRM, "fail": subjects.LEDGER_RESOURCE_FAIL,
    "reconcile": subjects.LEDGER_RECONCILE_PATTERN, "expire": subjects.LEDGER_EXPIRED_PATTERN,
    "claim": subjects.LEDGER_SWEEP_CLAIM, "reverted": subjects.LEDGER_SWEEP_REVERTED,
    "failed": subjects.LEDGER_SWEEP_FAILED, "outcomes": subjects.LEDGER_SWEEP_OUTCOMES,
    "finish": subjects.LEDGER_SWEEP_FINISH, "retry": subjects.LEDGER_SWEEP_RETRY,
    "settle": subjects.LEDGER_SWEEP_SETTLE,
}
REQUEST_TIMEOUT_S = 5.0
SETTLE_S = 90.0
"""How long a request whose answer was lost (timeout, no responders, 503) is sent again, with
the same body (idempotency key), before the test gives up on the ledger."""
NATS_PAUSE_S = 1.5
"""How long a NATS pause (SIGSTOP … SIGCONT) lasts."""


class Loop:
    """An asyncio loop on a thread of its own; :meth:`run` waits for a coroutine, bounded."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True, name="model-loop")
        self.thread.start()

    def run(self, coro: Coroutine[Any, Any, Any], timeout: float = 120.0) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


@dataclass
class Step:
    """One rule's requests, fired together, and what came back."""

    rule: str
    requests: list[tuple[str, dict[str, Any]]]
    replies: list[dict[str, Any]] = field(default_factory=list)
    tries: list[int] = field(default_factory=list)

    def lines(self) -> list[str]:
        out = [f"{self.rule}:"]
        for (op, req), reply, tries in zip(self.requests, self.replies, self.tries, strict=False):
            brief = {k: reply[k] for k in ("status", "error", "expired", "orphaned", "settled", "recorded",
                                           "conflicts") if k in reply}
            if "resource" in reply:
                brief["resource"] = f"{reply['resource']['resourceId']} {reply['resource']['status']}"
            if "resources" in reply:
                brief["resources"] = [r["resourceId"] for r in reply["resources"]]
            if "run" in reply:
                brief["run"] = f"{reply['run']['status']}/{reply['run']['cleanupStatus']}"
            out.append(f"    {op} {json.dumps(req, sort_keys=True)} -> {brief}" + (f" (after {tries} tries)"
                                                                                     if tries > 1 else ""))
        return out


class Servers:
    """A nats-server and a PostgreSQL of the test's own, so that a rule may pause the one
    (SIGSTOP) and restart the other without touching the session's servers or another test."""

    def __init__(self) -> None:
        # Not under pytest's tmp_path: PostgreSQL, run as its own user under root, could not
        # reach it (tests/faults/test_postgres_restart.py says why).
        self.dir = Path(tempfile.mkdtemp(prefix="shardbus-model-"))
        self.pg_port = embedded.free_port()
        self.nats = embedded.start_nats(self.dir / "nats")
        try:
            self.pg = embedded.start_postgres(self.dir / "pg", port=self.pg_port, durable=False)
            self.pg.create_database("ledger")
        except BaseException:
            self.nats.stop()
            raise
        self.database_url = self.pg.url("ledger")

    def pause_nats(self) -> None:
        """Freeze nats-server for :data:`NATS_PAUSE_S` (every connection stalls), then thaw it."""
        time.sleep(0.05)  # let the step's requests leave first
        self.nats.proc.send_signal(signal.SIGSTOP)
        try:
            time.sleep(NATS_PAUSE_S)
        finally:
            self.nats.proc.send_signal(signal.SIGCONT)

    def restart_postgres(self) -> None:
        """Stop PostgreSQL (fast shutdown: open transactions roll back), start it again."""
        time.sleep(0.05)
        self.pg.stop()
        self.pg = embedded.start_postgres(self.dir / "pg", port=self.pg_port, durable=False)

    def stop(self) -> None:
        try:
            self.pg.stop()
        finally:
            self.nats.proc.send_signal(signal.SIGCONT)  # a frozen server would not hear SIGTERM
            self.nats.stop()
            shutil.rmtree(self.dir, ignore_errors=True)


class Ledger:
    """The replicas and the client."""

    def __init__(self, loop: Loop, procs: ServiceProcesses, servers: Servers, replicas: int) -> None:
        self.loop, self.procs, self.servers = loop, procs, servers
        self.replicas: list[ServiceProcess] = [self.start_replica() for _ in range(replicas)]
        self.nc: nats.NATS = loop.run(nats.connect(servers.nats.url, connect_timeout=5, max_reconnect_attempts=-1,
                                                   reconnect_time_wait=0.2))

    def start_replica(self) -> ServiceProcess:
        return self.procs.start("ledger", database_url=self.servers.database_url, db_pool_size="4")

    def kill_and_restart(self, index: int) -> None:
        """SIGKILL one replica (whatever it had in flight is lost mid-way), start another."""
        time.sleep(0.05)
        victim = self.replicas[index % len(self.replicas)]
        victim.proc.send_signal(signal.SIGKILL)
        victim.proc.wait(10)
        self.replicas[index % len(self.replicas)] = self.start_replica()

    def close(self) -> None:
        self.loop.run(self.nc.close(), 10)

    async def ask(self, op: str, req: dict[str, Any], module: str) -> tuple[dict[str, Any], int]:
        """Send one request until it is answered (a lost answer is sent again, same body)."""
        subject = OP_SUBJECTS[op].format(module=module)
        payload = json.dumps(req).encode()
        deadline = time.monotonic() + SETTLE_S
        for tries in itertools.count(1):
            if time.monotonic() > deadline:
                raise TimeoutError(f"{op} {req} not answered within {SETTLE_S} s ({tries - 1} tries)")
            try:
                reply = json.loads((await self.nc.request(subject, payload, timeout=REQUEST_TIMEOUT_S)).data)
                if reply.get("status") != 503:
                    return reply, tries
            except (nats.errors.Error, OSError, TimeoutError):  # lost on the way: timeout, no responders,
                pass                                             # reconnecting (a paused or restarted server)
            await asyncio.sleep(0.2)
        raise AssertionError("unreachable")

    def fire(self, step: Step, module: str, during: Any = None) -> None:
        """Send the step's requests at once (asyncio.gather); ``during`` (a callable) runs on
        this thread meanwhile (a fault)."""
        async def all_at_once() -> list[tuple[dict[str, Any], int]]:
            return await asyncio.gather(*(self.ask(op, req, module) for op, req in step.requests))
        future = asyncio.run_coroutine_threadsafe(all_at_once(), self.loop.loop)
        if during is not None:
            during()
        for reply, tries in future.result(SETTLE_S + 2 * REQUEST_TIMEOUT_S):
            step.replies.append(reply)
            step.tries.append(tries)


def explain(m: Model, step: Step) -> Model:
    """The model's state after a step whose requests raced: the first order of them in which
    every reply is one the model allows. AssertionError when no order does."""
    reasons = []
    for order in itertools.permutations(range(len(step.requests))):
        state = m
        try:
            for i in order:
                op, req = step.requests[i]
                state = check(state, op, req, step.replies[i])
        except Refused as why:
            reasons.append(f"order {order}: {why}")
            continue
        return state
    raise AssertionError("no order of the step's requests explains its replies:\n  " + "\n  ".join(reasons[:6]))


async def read_events(nc: nats.NATS, run_id: str, expect: int,
                      timeout: float = 15.0) -> list[tuple[str, dict[str, Any]]]:
    """Every event LEDGER_EVENTS holds for ``run_id`` (Nats-Msg-Id, body): an ordered consumer
    from the start, read until ``expect`` arrived and then until the stream is quiet."""
    js = nc.jetstream()
    sub = await js.subscribe(subjects.LEDGER_EVENTS_WILDCARD.replace("*", run_id),
                             stream=subjects.LEDGER_EVENTS_STREAM, ordered_consumer=True)
    found: list[tuple[str, dict[str, Any]]] = []
    deadline = time.monotonic() + timeout
    try:
        while True:
            wait = max(0.1, deadline - time.monotonic()) if len(found) < expect else 0.5
            try:
                msg = await sub.next_msg(timeout=wait)
            except nats.errors.TimeoutError:
                if len(found) >= expect or time.monotonic() >= deadline:
                    return found
                continue
            found.append(((msg.headers or {}).get("Nats-Msg-Id", ""), json.loads(msg.data)))
    finally:
        await sub.unsubscribe()


async def read_state(nc: nats.NATS, run_id: str) -> dict[str, Any]:
    """What the ledger says of a run: its console (run and rows) and its log."""
    console = json.loads((await nc.request(subjects.LEDGER_CONSOLE, json.dumps({"runId": run_id}).encode(),
                                           timeout=REQUEST_TIMEOUT_S)).data)
    log = json.loads((await nc.request(subjects.LEDGER_LOG, json.dumps({"runId": run_id}).encode(),
                                       timeout=REQUEST_TIMEOUT_S)).data)
    assert console["status"] == 200 and log["status"] == 200, (console, log)
    assert console["next"] is None and log["next"] is None, "a model run outgrew one page"
    return {"console": console, "log": log["entries"]}
