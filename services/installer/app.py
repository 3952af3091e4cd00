"""Installer wiring: install, remove and list the site's module."""

from __future__ import annotations

from pathlib import Path

from faststream import FastStream

from services.installer.settings import InstallerSettings
from shared.broker import add_health, make_app, make_broker


def create_app(settings: InstallerSettings | None = None) -> FastStream:
    """The installer as a FastStream app: run it with ``shardbus run installer``."""
    settings = settings or InstallerSettings()
    broker = make_broker(settings, "installer")
    app = make_app(broker, "installer")

    @app.on_startup
    async def ensure_modules_dir() -> None:
        Path(settings.modules_dir).mkdir(parents=True, exist_ok=True)

    add_health(app, broker, "installer", settings)
    return app
