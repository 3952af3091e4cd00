"""The services, in one place: what ``shardbus`` runs and documents.

Every list of services in ``shardbus/`` reads :data:`SERVICES` — ``shardbus run`` and
``healthcheck`` (their choices), each service's own commands (``cli.build_parser``),
``shardbus up`` (start order, ``--replicas``), ``shardbus status`` (the services shown even
with no replica), the README's settings table (``settings_catalog``) — and so does ``make
docs``, through ``python -m shardbus.registry --asyncapi``. Adding a service is one entry here
(plus its compose service, its NATS user in ``deploy/nats/*.conf``, and what is special about
it).

Each entry names code by import path (``"module:attribute"``), so reading the registry imports
no service: ``shardbus status`` or ``shardbus up --help`` load none, ``shardbus run NAME`` loads
only NAME's app. ``shared/`` never imports this module (it imports no service), nor does any
service.
"""

from __future__ import annotations

import importlib
import sys
from dataclasses import dataclass


@dataclass(frozen=True)
class Service:
    """One service of the system."""

    name: str
    """What ``shardbus run``, ``--replicas``, ``status``, the logs and compose call it."""
    app: str
    """Its app factory, ``"module:function"``: called with no argument it returns the FastStream
    app that ``shardbus run`` serves and ``faststream docs gen --factory`` documents. The module
    may name an event loop (``LOOP_FACTORY``)."""
    settings: str
    """Its settings class, ``"module:Class"`` (a ``CommonSettings``): the README's table."""
    commands: str | None = None
    """The module adding its own ``shardbus`` subcommands (``register(subparsers)``), if any."""
    asyncapi: bool = True
    """Whether ``make docs`` writes its AsyncAPI document, ``docs/asyncapi/<name>.json``: every
    subject it serves. The web door serves HTTP instead; its OpenAPI document comes from
    ``services.web.openapi``."""


SERVICES: tuple[Service, ...] = (
    Service("gateway", app="services.gateway.app:create_app",
            settings="services.gateway.settings:GatewaySettings"),
    Service("ledger", app="services.ledger.app:create_app",
            settings="services.ledger.settings:LedgerSettings"),
    Service("cleanup", app="services.cleanup.app:create_app",
            settings="services.cleanup.settings:CleanupSettings", commands="services.cleanup.commands"),
    Service("installer", app="services.installer.app:create_app",
            settings="services.installer.settings:InstallerSettings", commands="services.installer.commands"),
    Service("web", app="services.web.app:create_app",
            settings="services.web.settings:WebSettings", asyncapi=False),
)
"""Every service, in start order (``shardbus up`` starts them so, and lists them so)."""

NAMES: tuple[str, ...] = tuple(service.name for service in SERVICES)
"""Every service's name, in start order."""


def get(name: str) -> Service:
    """The service called ``name``; KeyError if there is none."""
    for service in SERVICES:
        if service.name == name:
            return service
    raise KeyError(name)


def load(path: str) -> object:
    """What an import path (``"module:attribute"``) names, its module imported."""
    module, sep, attribute = path.partition(":")
    if not sep or not module or not attribute:
        raise ValueError(f"{path!r} is not module:attribute")
    return getattr(importlib.import_module(module), attribute)


def main(argv: list[str]) -> int:
    """``python -m shardbus.registry``: every service's name, one a line; with ``--asyncapi``,
    ``<name> <app factory>`` of each service that has an AsyncAPI document (``make docs``)."""
    if argv == ["--asyncapi"]:
        print("\n".join(f"{service.name} {service.app}" for service in SERVICES if service.asyncapi))
    elif not argv:
        print("\n".join(NAMES))
    else:
        print("usage: python -m shardbus.registry [--asyncapi]", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
