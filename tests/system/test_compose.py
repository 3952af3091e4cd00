"""compose.yaml can only be checked offline here (no Docker engine): every service runs a
real ``shardbus`` subcommand and sets only real settings; the README documents each one."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from shardbus.cli import build_parser
from shardbus.settings_catalog import all_settings

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = yaml.safe_load((ROOT / "compose.yaml").read_text())
BUILT = {name: svc for name, svc in COMPOSE["services"].items() if "build" in svc}


def test_compose_runs_the_four_services_a_migration_nats_and_postgres():
    assert {"gateway", "ledger", "cleanup", "installer", "migrate", "nats", "postgres"} <= set(COMPOSE["services"])


@pytest.mark.parametrize("name", sorted(BUILT))
def test_each_service_command_is_a_real_shardbus_subcommand(name):
    args = build_parser().parse_args(BUILT[name]["command"])  # SystemExit if not
    assert callable(args.func)


@pytest.mark.parametrize("name", sorted(BUILT))
def test_each_environment_variable_a_service_sets_is_a_real_setting(name):
    known = all_settings()
    unknown = [env for env in BUILT[name].get("environment", {}) if env not in known]
    assert unknown == []


@pytest.mark.parametrize("name", ["gateway", "ledger", "cleanup", "installer"])
def test_each_service_has_a_health_check_that_is_a_real_command(name):
    test = BUILT[name]["healthcheck"]["test"]
    assert test[:2] == ["CMD", "shardbus"]
    build_parser().parse_args(test[2:])


def test_the_readme_documents_every_setting():
    readme = (ROOT / "README.md").read_text()
    missing = [env for env in all_settings() if f"`{env}`" not in readme]
    assert missing == []


@pytest.mark.skipif(shutil.which("docker-compose") is None, reason="docker-compose (v1) is not installed")
def test_docker_compose_accepts_the_file():
    env = {**os.environ, "SHARD_TOKEN": "x" * 24}
    done = subprocess.run(["docker-compose", "-f", str(ROOT / "compose.yaml"), "config", "-q"],
                          capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 0, done.stderr
