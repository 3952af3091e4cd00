"""The installer's settings (environment variables with the ``SHARDBUS_`` prefix)."""

from __future__ import annotations

from pydantic import Field

from shared.settings import CommonSettings


class InstallerSettings(CommonSettings):
    """Where modules live and where they may come from."""

    modules_dir: str = Field(default="modules", description="Directory the site's module is installed in.")
