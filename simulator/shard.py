"""The simulated shard as a real TCP client of the gateway, speaking protocol 7 exactly as
the sidecar seed quotes it (:mod:`simulator.seed_wire`): nothing invented.

It says hello, answers pings, executes commands against a :class:`~simulator.world.ShardWorld`,
replays keyed commands from its idempotency cache (``replayed: true``, S004:1578), answers
``bridge.busy`` while a command under the same key is still in flight (S004:956), takes the
news the gateway pushes (``news.add``, S004:293), and sends big guild rosters in chunks
(``id``/``seq``/``more``/``members``, S004:263-276). Frames carry no ``seq`` unless asked
(``sequenced=True``: the optional acknowledgement of docs/gateway.md, "Frames", beyond today's shards). It counts, per
verb, the commands executed and the commands replayed.
"""

from __future__ import annotations

import asyncio
import json
import logging
import ssl
import time
from collections import Counter
from typing import Any

from simulator.world import ShardWorld

log = logging.getLogger("shardbus.shard-sim")

PROTOCOL = 7
"""The protocol version the simulator speaks."""

ROSTER_CHUNK = 500
"""Members per ``guild.roster`` frame."""

LEASE_CHECK_S = 0.05
"""How often lease deadlines are checked."""


class ShardSimulator:
    """One simulated shard connected to a gateway."""

    def __init__(self, host: str, port: int, shard: str, token: str, *, protocol: int = PROTOCOL,
                 world: ShardWorld | None = None, sequenced: bool = False, first_seq: int | None = None,
                 answer_pings: bool = True, max_line: int = 16 * 1024 * 1024,
                 tls: ssl.SSLContext | None = None, server_hostname: str | None = None) -> None:
        self.host, self.port, self.shard, self.token = host, port, shard, token
        self.tls, self.server_hostname = tls, server_hostname
        """TLS to the gateway (docs/gateway.md, "TLS"): the context verifying it (and presenting
        the shard's certificate), and the name to verify (default: ``host``)."""
        self.protocol = protocol
        self.world = world or ShardWorld()
        self.sequenced = sequenced
        # A fresh number per process, so a restarted shard is not mistaken for a resend.
        self.next_seq = first_seq if first_seq is not None else time.time_ns() // 1000
        self.answer_pings = answer_pings
        self.max_line = max_line
        self.unacked: dict[int, bytes] = {}
        self.executed: Counter[str] = Counter()
        self.replayed: Counter[str] = Counter()
        self.busy: Counter[str] = Counter()
        self.answer_delay_s: dict[str, float] = {}
        self.mute: set[str] = set()
        self.received: list[dict[str, Any]] = []
        self.news: list[dict[str, Any]] = []
        self.refused: str | None = None
        """Why the gateway refused the hello, when it said so before closing."""
        self.tls_error: str | None = None
        """The TLS alert the gateway closed the connection with (OpenSSL's reason), if it did."""
        self._done: dict[str, dict[str, Any]] = {}
        self._in_flight: set[str] = set()
        self._outbox: list[bytes] = []
        self._writer: asyncio.StreamWriter | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._reader_task: asyncio.Task[None] | None = None
        self._acked = asyncio.Event()
        self.disconnected = asyncio.Event()

    # --- connection -------------------------------------------------------------------

    @property
    def connected(self) -> bool:
        return self._writer is not None and not self._writer.is_closing()

    async def connect(self, timeout: float = 5.0) -> None:
        """Dial the gateway, say hello and resend every frame not yet acknowledged."""
        reader, writer = await asyncio.wait_for(
            asyncio.open_connection(self.host, self.port, limit=self.max_line, ssl=self.tls,
                                    server_hostname=(self.server_hostname or self.host) if self.tls else None,
                                    ssl_handshake_timeout=timeout if self.tls else None), timeout)
        self._writer = writer
        self.disconnected.clear()
        hello = {"t": _now_ms(), "kind": "server.hello", "shard": self.shard,
                 "protocol": self.protocol, "token": self.token}
        writer.write(_line(hello))
        for seq in sorted(self.unacked):
            writer.write(self.unacked[seq])
        await writer.drain()
        self._reader_task = asyncio.create_task(self._read(reader))
        if not any(t.get_name() == "lease-clock" for t in self._tasks):
            self._spawn(self._lease_clock(), "lease-clock")

    async def close(self) -> None:
        """Disconnect and stop every task."""
        if self._writer is not None:
            self._writer.close()
        if self._reader_task:
            self._reader_task.cancel()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, *( [self._reader_task] if self._reader_task else []),
                             return_exceptions=True)
        self._writer = None

    async def drop(self) -> None:
        """Lose the connection abruptly (the world and unacknowledged frames are kept)."""
        if self._writer is not None:
            self._writer.transport.abort()
        if self._reader_task:
            await asyncio.gather(self._reader_task, return_exceptions=True)
        self._writer = None

    # --- frames -----------------------------------------------------------------------

    async def send(self, kind: str, **fields: Any) -> int | None:
        """Send a frame; numbered with ``seq`` (kept until acknowledged) when sequenced."""
        frame: dict[str, Any] = {"t": _now_ms(), "kind": kind, **fields}
        seq = None
        if self.sequenced and "seq" not in fields:
            seq = frame["seq"] = self.next_seq
            self.next_seq += 1
        data = _line(frame)
        if seq is not None:
            self.unacked[seq] = data
            self._acked.clear()
        if self.connected:
            await self.send_raw(data)
        elif seq is None:
            raise ConnectionError("not connected to the gateway")
        return seq

    async def send_raw(self, data: bytes) -> None:
        """Write bytes as they are (tests send malformed lines this way)."""
        if self._writer is None:
            raise ConnectionError("not connected to the gateway")
        self._writer.write(data)
        await self._writer.drain()

    async def send_guild(self, guild_id: int, name: str, members: list[dict[str, Any]] | None,
                         chunk: int = ROSTER_CHUNK, **extra: Any) -> None:
        """A guild's ``guild.update`` (S004:827), then (unless None) its ``guild.roster`` in chunks
        of ``chunk`` members, ``seq`` 0, 1, … with ``more`` on all but the last (S004:263-276)."""
        await self.send("guild.update", id=guild_id, name=name, **extra)
        if members is None:
            return
        parts = [members[i:i + chunk] for i in range(0, len(members), chunk)] or [[]]
        for index, part in enumerate(parts):
            await self.send("guild.roster", id=guild_id, seq=index, more=index < len(parts) - 1,
                            members=part)

    async def wait_acked(self, timeout: float = 10.0) -> None:
        """Until every sequenced frame has been acknowledged by the gateway."""
        async with asyncio.timeout(timeout):
            while self.unacked:
                self._acked.clear()
                await self._acked.wait()

    # --- what the gateway sends -------------------------------------------------------

    async def _read(self, reader: asyncio.StreamReader) -> None:
        try:
            while line := await reader.readline():
                try:
                    message = json.loads(line)
                except ValueError:
                    log.warning("unreadable line from the gateway")
                    continue
                self._dispatch(message)
        except (ConnectionError, asyncio.LimitOverrunError, ValueError):
            pass
        except ssl.SSLError as exc:  # the gateway's alert: TLS 1.3 checks our certificate after our side is done
            self.tls_error = f"{exc.reason or exc}"
            log.warning("the gateway ended the TLS connection", extra={"reason": self.tls_error})
        finally:
            self.disconnected.set()

    def _dispatch(self, message: dict[str, Any]) -> None:
        kind = message.get("kind")
        if "reqId" in message and isinstance(kind, str):
            if self.answer_delay_s.get(kind):
                self._spawn(self._command(kind, message))
            else:
                self._command_now(kind, message)
        elif kind == "gateway.ping":
            if self.answer_pings and self._writer:
                self._writer.write(_line({"t": _now_ms(), "kind": "gateway.pong"}))
        elif kind == "frame.ack":
            seq = message.get("seq")  # the gateway's ack: an int (%d)
            if isinstance(seq, int):
                self.unacked.pop(seq, None)
            if not self.unacked:
                self._acked.set()
        elif kind == "news.add":
            self.news.append(message)
        elif kind == "gateway.hello.refused":
            self.refused = str(message.get("reason"))
        else:
            self.received.append(message)

    @property
    def in_flight(self) -> int:
        """Commands with an idempotency key taken but not yet carried out (in their answer delay)."""
        return len(self._in_flight)

    def _command_now(self, verb: str, body: dict[str, Any]) -> None:
        """A command answered in this turn of the event loop (no delay configured)."""
        key, early = self._check_key(verb, body)
        if early is None:
            early = self._execute(verb, body, key)
        if early is not None:
            self._answer(early)

    async def _command(self, verb: str, body: dict[str, Any]) -> None:
        """A command that takes ``answer_delay_s[verb]`` (in flight meanwhile)."""
        key, early = self._check_key(verb, body)
        if early is None:
            try:
                await asyncio.sleep(self.answer_delay_s.get(verb, 0))
            except asyncio.CancelledError:
                if key is not None:
                    self._in_flight.discard(key)
                raise
            early = self._execute(verb, body, key)
        if early is not None:
            self._answer(early)

    def _check_key(self, verb: str, body: dict[str, Any]) -> tuple[str | None, dict[str, Any] | None]:
        """The idempotency key, and a busy or replayed answer if the key decides it."""
        key = body.get("idempotencyKey")
        if key is None:
            return None, None
        key = json.dumps(key)
        if key in self._in_flight:
            self.busy[verb] += 1
            return key, {"kind": "bridge.busy", "reqId": body["reqId"]}
        if key in self._done:
            self.replayed[verb] += 1
            return key, {**self._done[key], "reqId": body["reqId"], "replayed": True}
        self._in_flight.add(key)
        return key, None

    def _execute(self, verb: str, body: dict[str, Any], key: str | None) -> dict[str, Any] | None:
        """Carry the command out; its answer (None when the verb is muted)."""
        try:
            answer = self.world.execute(verb, {k: v for k, v in body.items() if k not in ("kind", "reqId")})
            if answer is None:  # no seed route reaches this verb: what a shard says is unknown
                log.warning("a command no seed route reaches; not answered", extra={"verb": verb})
                return None
            self.executed[verb] += 1
            for frame in self.world.frames:  # world.save.before/after ride the stream
                self._spawn(self.send(frame.pop("kind"), **frame))
            self.world.frames.clear()
            # Only what was done is remembered; a refusal may succeed when asked again.
            if key is not None and not str(answer.get("kind", "")).endswith(".error"):
                self._done[key] = answer
        finally:
            if key is not None:
                self._in_flight.discard(key)
        return None if verb in self.mute else {**answer, "reqId": body["reqId"]}

    def _answer(self, answer: dict[str, Any]) -> None:
        # Answers of one turn of the event loop go out in one write.
        if not self._outbox:
            asyncio.get_running_loop().call_soon(self._flush_answers)
        self._outbox.append(_line({"t": _now_ms(), **answer}))

    def _flush_answers(self) -> None:
        lines, self._outbox = self._outbox, []
        writer = self._writer
        if lines and writer is not None and not writer.is_closing():  # self.connected
            writer.write(b"".join(lines))

    async def _lease_clock(self) -> None:
        """The shard restores a lease's baseline at its deadline whether or not anyone asks
        (S004:915-917); it says nothing on the stream, and lists the hold ``expired: true``."""
        while True:
            await asyncio.sleep(LEASE_CHECK_S)
            self.world.expire_leases()

    async def run_forever(self, retry_s: float = 1.0) -> None:
        """Stay connected: dial again whenever the connection is lost (the CLI's loop)."""
        while True:
            try:
                await self.connect()
                log.info("connected to the gateway", extra={"shard": self.shard})
                await self.disconnected.wait()
                if self.refused is not None:
                    log.error("the gateway refused this shard's hello; not dialling again",
                              extra={"shard": self.shard, "reason": self.refused})
                    return
                log.warning("connection lost; dialling again", extra={"shard": self.shard})
            except ssl.SSLCertVerificationError as exc:  # a wrong CA or name: dialling again changes nothing
                self.refused = f"the gateway's certificate was refused: {exc.verify_message or exc.reason}"
                log.error("the gateway's certificate was refused; not dialling again",
                          extra={"shard": self.shard, "reason": self.refused})
                return
            except (OSError, TimeoutError) as exc:
                log.warning("cannot reach the gateway", extra={"reason": repr(exc)})
            await asyncio.sleep(retry_s)

    def _spawn(self, coro: Any, name: str | None = None) -> None:
        task = asyncio.create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)


def _now_ms() -> int:
    return int(time.time() * 1000)


def _line(obj: dict[str, Any]) -> bytes:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode() + b"\n"
