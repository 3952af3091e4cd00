"""Ledger wiring: migrate on start, then answer the ledger's requests."""

from __future__ import annotations

import logging

from faststream import FastStream

from services.ledger import migrate
from services.ledger.settings import LedgerSettings
from shared import logs
from shared.broker import add_health, make_app, make_broker
from shared.database import safe_url

log = logging.getLogger("shardbus.ledger")


def create_app(settings: LedgerSettings | None = None) -> FastStream:
    """The ledger as a FastStream app: run it with ``shardbus run ledger``."""
    settings = settings or LedgerSettings()
    broker = make_broker(settings, "ledger")
    app = make_app(broker, "ledger")

    @app.on_startup
    async def bring_schema_forward() -> None:
        if settings.migrate_on_start:
            revision = await migrate.upgrade(settings.database_url)
            log.info("schema ready", extra={"revision": revision,
                                            "database": safe_url(settings.database_url)})

    add_health(app, broker, "ledger", settings)
    return app
