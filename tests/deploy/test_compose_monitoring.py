"""compose.yaml's `monitoring` profile and the metrics ports, read as compose reads them, alone
and with compose.cluster.yaml: every service serves /metrics on 9464 where Prometheus's DNS
jobs look, the exporters read what nats.conf and the cluster publish, and the real compose tool
(docker compose, docker-compose or podman-compose, whichever is here and has `config`) accepts
both files with and without the profile."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from functools import cache
from typing import Any

import pytest
import yaml

from tests.deploy import catalogue
from tests.deploy.conftest import PROMETHEUS_DIR, ROOT
from tests.system.test_compose import NODES, PASSWORDS, cluster_service

COMPOSE = yaml.safe_load((ROOT / "compose.yaml").read_text())
CLUSTER = yaml.safe_load((ROOT / "compose.cluster.yaml").read_text())
MONITORING = {"prometheus", "grafana", "nats-exporter", "postgres-exporter"}
PROMETHEUS = yaml.safe_load((PROMETHEUS_DIR / "prometheus.yml").read_text())
NATS_CONF = (ROOT / "deploy" / "nats" / "nats.conf").read_text()


def _nats_monitoring_port() -> int:
    match = re.search(r"^http_port:\s*(\d+)\s*$", NATS_CONF, re.M)
    assert match, "nats.conf sets no http_port (the monitoring port)"
    return int(match.group(1))


@pytest.mark.parametrize("name", catalogue.SERVICES)
@pytest.mark.parametrize("files", ["single", "cluster"])
def test_every_service_serves_metrics_on_all_its_interfaces_on_the_scraped_port(name, files):
    service = COMPOSE["services"][name] if files == "single" else cluster_service(name)
    env = service["environment"]
    port = next(job for job in PROMETHEUS["scrape_configs"] if job["job_name"] == name)["dns_sd_configs"][0]["port"]
    assert (env["SHARDBUS_METRICS_PORT"], env["SHARDBUS_METRICS_HOST"]) == (str(port), "0.0.0.0")
    assert "profiles" not in service


def test_the_monitoring_services_run_only_with_the_profile():
    profiled = {name for name, svc in COMPOSE["services"].items() if svc.get("profiles")}
    assert profiled == MONITORING
    assert all(COMPOSE["services"][name]["profiles"] == ["monitoring"] for name in MONITORING)


def test_prometheus_and_grafana_are_published_on_loopback_only():
    for name in ("prometheus", "grafana"):
        assert all(str(port).startswith("127.0.0.1:") for port in COMPOSE["services"][name]["ports"]), name
    assert all("ports" not in COMPOSE["services"][name] for name in ("nats-exporter", "postgres-exporter"))
    assert not any("8222" in str(port) for port in COMPOSE["services"]["nats"]["ports"])


def test_prometheus_reads_the_mounted_config_and_rules():
    prometheus = COMPOSE["services"]["prometheus"]
    assert "./deploy/prometheus:/etc/prometheus:ro" in prometheus["volumes"]
    assert "--config.file=/etc/prometheus/prometheus.yml" in prometheus["command"]


def _exporter_target(job_name: str) -> str:
    job = next(job for job in PROMETHEUS["scrape_configs"] if job["job_name"] == job_name)
    (target,) = job["static_configs"][0]["targets"]
    return target


def test_the_nats_exporter_reads_the_monitoring_port_of_nats_and_is_scraped_where_it_listens():
    command = COMPOSE["services"]["nats-exporter"]["command"]
    assert {"-varz", "-jsz=all", "-connz"} <= set(command)
    port = command[command.index("-port") + 1]
    assert _exporter_target("nats") == f"nats-exporter:{port}"
    assert [arg for arg in command if arg.startswith("http")] == [f"http://nats:{_nats_monitoring_port()}"]
    assert f"localhost:{_nats_monitoring_port()}/healthz" in COMPOSE["services"]["nats"]["healthcheck"]["test"][-1]


def test_on_the_cluster_the_nats_exporter_reads_every_node():
    exporter = cluster_service("nats-exporter")
    urls = [arg for arg in exporter["command"] if arg.startswith("http")]
    assert sorted(urls) == sorted(f"http://{host}:{_nats_monitoring_port()}" for host in NODES.values())
    assert exporter["profiles"] == ["monitoring"]
    assert set(CLUSTER["services"]["nats-exporter"]) <= {"profiles", "command", "depends_on"}


def test_the_postgres_exporter_reads_the_shardbus_database():
    exporter = COMPOSE["services"]["postgres-exporter"]
    assert exporter["environment"]["DATA_SOURCE_URI"].startswith("postgres:5432/shardbus?")
    postgres_user = COMPOSE["services"]["postgres"]["environment"]["POSTGRES_USER"]
    assert exporter["environment"]["DATA_SOURCE_USER"] == postgres_user
    assert _exporter_target("postgres") == "postgres-exporter:9187"


# --- the real compose tool ---------------------------------------------------------------------

@cache
def compose_command() -> tuple[str, ...] | None:
    """A compose with a `config` command: docker compose (v2), docker-compose (v1), podman-compose
    (Debian 12's 1.0.3 has no `config`, so it does not count)."""
    # (`docker compose config --help` succeeds without the plugin: the CLI reads it as `docker config`.)
    if shutil.which("docker") and subprocess.run(["docker", "compose", "version"], capture_output=True,
                                                 timeout=60).returncode == 0:
        return ("docker", "compose")
    for command in ("docker-compose", "podman-compose"):
        if shutil.which(command) and subprocess.run([command, "config", "--help"], capture_output=True,
                                                    timeout=60).returncode == 0:
            return (command,)
    return None


needs_compose = pytest.mark.skipif(compose_command() is None,
                                   reason="no docker compose, docker-compose or podman-compose with `config` here")


def compose_config(*files: str, profile: bool) -> dict[str, Any]:
    env = {**os.environ, "SHARD_TOKEN": "x" * 24, "WEB_TOKEN": "y" * 24, **PASSWORDS}
    args = [arg for name in files for arg in ("-f", str(ROOT / name))]
    command = [*compose_command(), *args, *(["--profile", "monitoring"] if profile else []), "config"]
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    return yaml.safe_load(done.stdout)


FILES = {"single": ("compose.yaml",), "cluster": ("compose.yaml", "compose.cluster.yaml")}


@needs_compose
@pytest.mark.parametrize("profile", [False, True], ids=["without-profile", "with-monitoring"])
@pytest.mark.parametrize("files", sorted(FILES))
def test_the_compose_tool_accepts_the_files(files, profile):
    services = compose_config(*FILES[files], profile=profile)["services"]
    profiled = {name for name, svc in services.items() if "monitoring" in svc.get("profiles", [])}
    # v2 lists a profile's services only when it is given; v1 always, with their `profiles`.
    assert profiled == MONITORING if profile or compose_command()[0] != "docker" else profiled == set()
    for name in catalogue.SERVICES:
        env = services[name]["environment"]
        assert (str(env["SHARDBUS_METRICS_PORT"]), env["SHARDBUS_METRICS_HOST"]) == ("9464", "0.0.0.0")
    if profiled:
        urls = [arg for arg in services["nats-exporter"]["command"] if arg.startswith("http")]
        hosts = sorted(NODES.values()) if files == "cluster" else ["nats"]
        assert sorted(re.sub(r"^http://([^:]+):\d+$", r"\1", url) for url in urls) == hosts
