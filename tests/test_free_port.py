"""The ports ``shardbus up`` and the test servers choose lie below the kernel's ephemeral range.

A port from ``bind(0)`` is drawn from the range the kernel also gives outgoing connections their
local port from, so a client anywhere on the machine could take it before the server that was
meant to listen there started (a CI run lost a ledger that way: its metrics port was taken)."""

from __future__ import annotations

import socket

from shardbus import embedded


def test_free_ports_are_below_the_ephemeral_range_and_bindable():
    low, _ = embedded._ephemeral_range()
    ports = {embedded.free_port() for _ in range(50)}
    assert all(10000 <= port < low for port in ports), sorted(ports)
    assert len(ports) > 40  # chosen at random, so two starts rarely race for one
    for port in list(ports)[:5]:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))


def test_a_listening_port_is_never_chosen(monkeypatch):
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 23456))
        holder.listen()
        draws = iter([23456, 23457])
        monkeypatch.setattr(embedded._PORT_DRAWS, "randrange", lambda a, b: next(draws))
        assert embedded.free_port() == 23457
