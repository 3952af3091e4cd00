"""``shardbus/registry.py`` is the one list of services: the CLI, ``shardbus up``, ``shardbus
status``, the settings table and ``make docs`` read it, and so do the tests about every service
(test_compose, test_asyncapi, test_fatal_close, test_nats_security). They can only be as right
as it is: here it is checked against the five services and the tree."""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path

import pytest

from shardbus import registry
from shardbus.settings_catalog import settings_class
from shared.settings import CommonSettings

ROOT = Path(__file__).resolve().parents[2]

EXPECTED = ("gateway", "ledger", "cleanup", "installer", "web")
"""The five services, in start order."""


def test_the_registry_holds_the_five_services_once_in_start_order():
    assert registry.NAMES == EXPECTED


def test_every_service_package_is_in_the_registry():
    packages = sorted(path.parent.name for path in (ROOT / "services").glob("*/app.py"))
    assert packages == sorted(registry.NAMES)


@pytest.mark.parametrize("service", registry.SERVICES, ids=registry.NAMES)
def test_each_entry_names_real_code(service):
    assert callable(registry.load(service.app))
    assert issubclass(settings_class(service.name), CommonSettings)
    if service.commands:
        assert callable(importlib.import_module(service.commands).register)


def test_every_services_commands_module_is_registered():
    found = sorted(f"services.{path.parent.name}.commands" for path in (ROOT / "services").glob("*/commands.py"))
    assert found == sorted(service.commands for service in registry.SERVICES if service.commands)


def test_the_committed_api_documents_are_the_registrys():
    asyncapi = sorted(path.stem for path in (ROOT / "docs" / "asyncapi").glob("*.json"))
    assert asyncapi == sorted(service.name for service in registry.SERVICES if service.asyncapi)
    assert asyncapi == ["cleanup", "gateway", "installer", "ledger"]  # web has an OpenAPI document instead
    for service in registry.SERVICES:
        if not service.asyncapi:
            assert (ROOT / "docs" / "openapi" / f"{service.name}.json").is_file()


def test_make_docs_takes_the_asyncapi_services_and_factories_from_the_registry():
    out = subprocess.run([sys.executable, "-m", "shardbus.registry", "--asyncapi"], check=True,
                         capture_output=True, text=True, timeout=30, cwd=ROOT).stdout
    assert out.splitlines() == [f"{name} services.{name}.app:create_app"
                                for name in ("gateway", "ledger", "cleanup", "installer")]
    listed = subprocess.run([sys.executable, "-m", "shardbus.registry"], check=True,
                            capture_output=True, text=True, timeout=30, cwd=ROOT).stdout
    assert tuple(listed.split()) == EXPECTED


def test_reading_the_registry_imports_no_service():
    """``shardbus status`` and ``shardbus up`` load no service module; ``run NAME`` loads its own."""
    code = ("import sys; import shardbus.registry, shardbus.cli, shardbus.status, shardbus.stack; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'services'))")
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True,
                         timeout=60, cwd=ROOT).stdout
    assert out.strip() == "[]"


def test_an_unknown_service_is_a_key_error():
    with pytest.raises(KeyError):
        registry.get("nope")
