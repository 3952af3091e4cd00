"""Cleanup wiring: the periodic and requested sweep."""

from __future__ import annotations

from faststream import FastStream

from services.cleanup.settings import CleanupSettings
from shared.broker import add_health, make_app, make_broker


def create_app(settings: CleanupSettings | None = None) -> FastStream:
    """The cleanup service as a FastStream app: run it with ``shardbus run cleanup``."""
    settings = settings or CleanupSettings()
    broker = make_broker(settings, "cleanup")
    app = make_app(broker, "cleanup")
    add_health(app, broker, "cleanup", settings)
    return app
