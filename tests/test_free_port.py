"""The ports ``shardbus up`` and the test servers choose lie below the kernel's ephemeral range.

A port from ``bind(0)`` is drawn from the range the kernel also gives outgoing connections their
local port from, so a client anywhere on the machine could take it before the server that was
meant to listen there started (a CI run lost a ledger that way: its metrics port was taken)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

from shardbus import embedded


def test_free_ports_are_below_the_ephemeral_range_and_bindable():
    low, _ = embedded._ephemeral_range()
    ports = {embedded.free_port() for _ in range(50)}
    assert all(10000 <= port < low for port in ports), sorted(ports)
    assert len(ports) > 40  # chosen at random, so two starts rarely race for one
    for port in list(ports)[:5]:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))


def test_a_listening_port_is_never_chosen(monkeypatch, tmp_path):
    monkeypatch.setattr(embedded, "_reservations", lambda: tmp_path)
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 23456))
        holder.listen()
        draws = iter([23456, 23457])
        monkeypatch.setattr(embedded._PORT_DRAWS, "randrange", lambda a, b: next(draws))
        assert embedded.free_port() == 23457


DRAWER = """
import sys
from shardbus import embedded
print(" ".join(str(embedded.free_port()) for _ in range(500)), flush=True)
sys.stdin.readline()
"""


def test_two_processes_drawing_at_once_never_get_the_same_port(tmp_path, monkeypatch):
    """The CI run that lost ``shardbus up``'s gateway to ``address already in use``: the other
    test worker drew the same port before the gateway listened. 500 draws against 500 met about
    11 times before draws were claimed machine-wide."""

    monkeypatch.setattr(embedded, "_reservations", lambda: tmp_path / f"shardbus-ports-{os.getuid()}")
    other = subprocess.Popen([sys.executable, "-c", DRAWER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             text=True, env={**os.environ, "TMPDIR": str(tmp_path)})
    try:
        assert other.stdout is not None and other.stdin is not None
        theirs = {int(port) for port in other.stdout.readline().split()}
        assert len(theirs) == 500
        ours = {embedded.free_port() for _ in range(500)}
        assert not ours & theirs
        taken_back = next(iter(theirs))
        assert not embedded.claim_port(taken_back)  # their claim holds while they live
        other.stdin.write("\n")
        other.stdin.flush()
        assert other.wait(timeout=30) == 0
    finally:
        if other.poll() is None:
            other.kill()
            other.wait(timeout=30)
    assert embedded.claim_port(taken_back)  # a restart takes back what its dead self drew


def test_a_port_asked_for_is_handed_to_the_process_that_listens(tmp_path, monkeypatch):
    """A test draws ports and asks ``shardbus up`` for them; the next start of that state
    directory, asked for nothing, keeps them: the claim went to the first start, now gone."""

    monkeypatch.setattr(embedded, "_reservations", lambda: tmp_path / f"shardbus-ports-{os.getuid()}")
    port = embedded.free_port()  # claimed by this (living) process
    holder = subprocess.run([sys.executable, "-c", f"from shardbus import embedded; embedded.hold_port({port})"],
                            env={**os.environ, "TMPDIR": str(tmp_path)}, timeout=30)
    assert holder.returncode == 0
    again = f"from shardbus import embedded; print(embedded.claim_port({port}))"
    reclaim = subprocess.run([sys.executable, "-c", again], env={**os.environ, "TMPDIR": str(tmp_path)},
                             capture_output=True, text=True, timeout=30)
    assert reclaim.stdout.strip() == "True"
