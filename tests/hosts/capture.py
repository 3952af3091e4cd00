"""What crosses the wire between the hosts (docs/security.md, "TLS"): Debian's tcpdump on the
bridge of ``net.py`` (every packet between two hosts crosses it) writing a pcap file, and a small
reader of that file giving each TCP connection's bytes, each direction on its own, in order.

tcpdump runs in the test's own namespace, started and stopped by its handle (:class:`Tcpdump`);
``make tcpdump`` installs it when missing."""

from __future__ import annotations

import re
import signal
import socket
import struct
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from shardbus.embedded import stop_process

TCPDUMP = "/usr/bin/tcpdump"

PCAP_MAGIC = {b"\xd4\xc3\xb2\xa1": "<", b"\xa1\xb2\xc3\xd4": ">", b"\x4d\x3c\xb2\xa1": "<", b"\xa1\xb2\x3c\x4d": ">"}
"""The pcap file's first four bytes: its byte order (microsecond or nanosecond timestamps)."""

ETHERNET, IPV4, TCP = 1, 0x0800, 6
SYN = 0x02


class Tcpdump:
    """``tcpdump -i <interface> -w <pcap>``: every TCP packet, whole (``-s 0``), written as the
    kernel hands it over (``-U``), as root (``-Z root``: Debian's tcpdump otherwise drops to a
    user that may not write the test's folder)."""

    def __init__(self, interface: str, pcap: Path, log: Path, bpf: str = "tcp") -> None:
        self.interface, self.pcap, self.log_path, self.bpf = interface, pcap, log, bpf
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 10.0) -> None:
        """Returns once tcpdump says it is listening: from then on, every packet is in the file."""
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen([TCPDUMP, "-i", self.interface, "-w", str(self.pcap), "-U", "-s", "0",
                                          "-n", "-Z", "root", self.bpf],
                                         stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout
        while "listening on" not in self.log():
            if self.proc.poll() is not None:
                raise RuntimeError(f"tcpdump exited with {self.proc.returncode}:\n{self.log()}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"tcpdump not listening within {timeout} s:\n{self.log()}")
            time.sleep(0.05)

    def stop(self, quiet: float = 1.5, timeout: float = 10.0) -> int:
        """Once the file has not grown for ``quiet`` s (at most ``timeout`` s): the kernel hands
        packets over a block at a time, within tcpdump's 1 s timeout, and a block still held when
        tcpdump stops is lost (counted as received by the filter, never captured). Then SIGINT
        (tcpdump writes its counts and exits); its exit code. Stop the traffic first."""
        if self.proc is None:
            return 0
        deadline, size, since = time.monotonic() + timeout, -1, time.monotonic()
        while self.proc.poll() is None and time.monotonic() < deadline:
            now = self.pcap.stat().st_size if self.pcap.exists() else 0
            if now != size:
                size, since = now, time.monotonic()
            elif time.monotonic() - since >= quiet:
                break
            time.sleep(0.1)
        return stop_process(self.proc, signal.SIGINT)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def counts(self) -> dict[str, int]:
        """What tcpdump said on exit: packets ``captured``, ``received by filter``, ``dropped by kernel``."""
        found = (re.match(r"^(\d+) packets? (captured|received by filter|dropped by kernel)$", line)
                 for line in self.log().splitlines())
        return {m[2]: int(m[1]) for m in found if m}


@contextmanager
def tcpdump(interface: str, pcap: Path, log: Path, bpf: str = "tcp") -> Iterator[Tcpdump]:
    """A started :class:`Tcpdump`, stopped on the way out whatever happened."""
    capture = Tcpdump(interface, pcap, log, bpf)
    try:
        capture.start()
        yield capture
    finally:
        capture.stop()


@dataclass
class Flow:
    """One direction of one TCP connection: its bytes in sequence order (retransmissions once)."""

    src: tuple[str, int]
    dst: tuple[str, int]
    syn: bool = False
    segments: dict[int, bytes] = field(default_factory=dict)
    first_seq: int | None = None

    def add(self, seq: int, flags: int, payload: bytes) -> None:
        if flags & SYN:
            self.syn, self.first_seq = True, (seq + 1) % 2**32
        elif self.first_seq is None:
            self.first_seq = seq
        if payload:
            self.segments.setdefault(seq, payload)

    def data(self) -> bytes:
        """The bytes in order; a segment overlapping what came before adds only what is new."""
        base = self.first_seq or 0
        out = bytearray()
        for offset, payload in sorted(((seq - base) % 2**32, p) for seq, p in self.segments.items()):
            if offset + len(payload) > len(out):
                out += payload[max(0, len(out) - offset):]
        return bytes(out)


def read_flows(pcap: Path) -> dict[tuple[tuple[str, int], tuple[str, int]], Flow]:
    """Every TCP flow (IPv4 over Ethernet) in ``pcap``, by (source, destination)."""
    raw = pcap.read_bytes()
    order = PCAP_MAGIC.get(raw[:4])
    if order is None:
        raise ValueError(f"{pcap} is not a pcap file ({raw[:4]!r})")
    linktype = struct.unpack(order + "I", raw[20:24])[0]
    if linktype != ETHERNET:
        raise ValueError(f"{pcap}: link type {linktype}, not Ethernet")
    flows: dict[tuple[tuple[str, int], tuple[str, int]], Flow] = {}
    at = 24
    while at + 16 <= len(raw):
        captured = struct.unpack(order + "I", raw[at + 8:at + 12])[0]
        frame = raw[at + 16:at + 16 + captured]
        at += 16 + captured
        if len(frame) < 14 + 20 or struct.unpack("!H", frame[12:14])[0] != IPV4:
            continue
        ip = frame[14:]
        header, total = (ip[0] & 0x0F) * 4, struct.unpack("!H", ip[2:4])[0]
        if ip[9] != TCP:
            continue
        tcp = ip[header:total]
        src, dst = socket.inet_ntoa(ip[12:16]), socket.inet_ntoa(ip[16:20])
        sport, dport, seq = struct.unpack("!HHI", tcp[:8])
        offset, flags = (tcp[12] >> 4) * 4, tcp[13]
        key = ((src, sport), (dst, dport))
        flows.setdefault(key, Flow(*key)).add(seq, flags, tcp[offset:])
    return flows


def between(flows: dict[tuple[tuple[str, int], tuple[str, int]], Flow], a: set[str], b: set[str],
            port: int) -> list[Flow]:
    """The flows, both directions, of connections between an address of ``a`` and one of ``b`` on
    ``port`` (the listening side's)."""
    return [f for f in flows.values()
            if port in (f.src[1], f.dst[1]) and {f.src[0], f.dst[0]} & a and {f.src[0], f.dst[0]} & b
            and f.src[0] != f.dst[0]]
