"""The live feed (docs/web.md, "The live feed"): ``/ws`` and ``/events`` stream the frames,
board changes and ledger events from one JetStream stream, every event with its cursor.
``routes.py`` is the HTTP side; ``hub.py`` the clients; ``reader.py`` the NATS side."""
