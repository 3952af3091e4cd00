"""compose.yaml can only be checked offline here (no Docker engine): every service runs a
real ``shardbus`` subcommand and sets only real settings; the README documents each one.

compose.cluster.yaml, the override that runs the system on a 3-node NATS cluster, is checked
the same way, merged as compose merges it: every service lists all three nodes, each with the
service's own user and password, and creates R3 streams; every node runs cluster-node.conf with
its own name and store and the same users. Where docker compose (v2) or docker-compose (v1)
is installed, the real tool's merge of the two files is checked too.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from shardbus import registry
from shardbus.cli import build_parser
from shardbus.settings_catalog import all_settings

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = yaml.safe_load((ROOT / "compose.yaml").read_text())
BUILT = {name: svc for name, svc in COMPOSE["services"].items() if "build" in svc}
CLUSTER = yaml.safe_load((ROOT / "compose.cluster.yaml").read_text())
SERVICES = registry.NAMES
NODES = {"nats": "nats-1", "nats-2": "nats-2", "nats-3": "nats-3"}
"""The cluster's nodes: compose service -> host name (network alias) and NATS server name."""
NODE_CONFIG = ROOT / "deploy" / "nats" / "cluster-node.conf"


def test_compose_runs_the_five_services_a_migration_nats_and_postgres():
    assert {*SERVICES, "migrate", "nats", "postgres"} <= set(COMPOSE["services"])


@pytest.mark.parametrize("name", sorted(BUILT))
def test_each_service_command_is_a_real_shardbus_subcommand(name):
    args = build_parser().parse_args(BUILT[name]["command"])  # SystemExit if not
    assert callable(args.func)


@pytest.mark.parametrize("name", sorted(BUILT))
def test_each_environment_variable_a_service_sets_is_a_real_setting(name):
    known = all_settings()
    unknown = [env for env in BUILT[name].get("environment", {}) if env not in known]
    assert unknown == []


@pytest.mark.parametrize("name", SERVICES)
def test_each_service_has_a_health_check_that_is_a_real_command(name):
    test = BUILT[name]["healthcheck"]["test"]
    assert test[:2] == ["CMD", "shardbus"]
    build_parser().parse_args(test[2:])


def test_the_readme_documents_every_setting():
    readme = (ROOT / "README.md").read_text()
    missing = [env for env in all_settings() if f"`{env}`" not in readme]
    assert missing == []


def test_a_setting_two_services_read_differently_shows_each_default_and_meaning():
    # SHARDBUS_COMMAND_TIMEOUT_S is how long the gateway waits for the shard (5 s) and how long
    # cleanup waits for a give-back through it (15 s); one row showed only cleanup's.
    rows = [line for line in (ROOT / "README.md").read_text().splitlines()
            if line.startswith("| `SHARDBUS_COMMAND_TIMEOUT_S` |")]
    assert [(row.split("|")[2].strip(), row.split("|")[3].strip()) for row in rows] == [
        ("gateway", "`5.0`"), ("cleanup", "`15.0`")]


def test_the_image_copies_every_package_the_project_installs():
    # `shardbus shard-sim` in the image needs simulator/ (it was missing).
    dockerfile = (ROOT / "Dockerfile").read_text()
    packages = ["shardbus", "shared", "services", "simulator"]
    assert [p for p in packages if f"COPY {p} ./{p}" not in dockerfile] == []
    assert '"simulator*"' in (ROOT / "pyproject.toml").read_text()


def test_the_nats_websocket_listener_is_published_where_nats_conf_puts_it():
    conf = (ROOT / "deploy" / "nats" / "nats.conf").read_text()
    block = re.search(r"^websocket \{(.*?)^\}", conf, re.S | re.M)
    assert block and re.search(r"^\s*port:\s*9222\s*$", block.group(1), re.M)
    assert re.search(r"^\s*no_tls:\s*true\s*$", block.group(1), re.M)
    assert "${NATS_WS_PORT:-9222}:9222" in COMPOSE["services"]["nats"]["ports"]


# Every host port a variable with its default (docs/operations.md, "Compose for real"): another
# NATS on 4222, say, is moved out of the way with NATS_PORT rather than by editing the file.
HOST_PORTS = {"nats": ["${NATS_PORT:-4222}:4222", "${NATS_WS_PORT:-9222}:9222"],
              "gateway": ["${SHARD_PORTS:-2595-2604}:2595"], "web": ["${WEB_PORTS:-8080-8089}:8080"],
              "prometheus": ["127.0.0.1:${PROMETHEUS_PORT:-9090}:9090"],
              "grafana": ["127.0.0.1:${GRAFANA_PORT:-3000}:3000"]}


def test_every_published_host_port_is_a_variable_with_its_default():
    published = {name: svc["ports"] for name, svc in COMPOSE["services"].items() if "ports" in svc}
    assert published == HOST_PORTS
    documented = (ROOT / "docs" / "operations.md").read_text()
    for port in (p for ports in HOST_PORTS.values() for p in ports):
        variable = re.search(r"\$\{(\w+):-", port)
        assert variable and f"`{variable.group(1)}`" in documented, port


def test_the_web_door_listens_on_all_interfaces_of_its_container_and_is_published():
    web = COMPOSE["services"]["web"]
    env = web["environment"]
    assert env["SHARDBUS_WEB_HOST"] == "0.0.0.0" and env["SHARDBUS_WEB_PORT"] == "8080"
    assert any(str(port).endswith(":8080") for port in web["ports"])
    with pytest.raises(KeyError, match="WEB_TOKEN"):  # compose refuses to start it without a token
        interpolate(env["SHARDBUS_WEB_TOKEN"], {})


def _compose_command() -> list[str] | None:
    """``docker compose`` (v2) if the plugin is there, else ``docker-compose`` (v1), else None."""
    if shutil.which("docker") and subprocess.run(["docker", "compose", "version"], capture_output=True,
                                                 timeout=30).returncode == 0:
        return ["docker", "compose"]
    return ["docker-compose"] if shutil.which("docker-compose") else None


COMPOSE_CMD = _compose_command()
needs_compose = pytest.mark.skipif(COMPOSE_CMD is None, reason="neither docker compose nor docker-compose is installed")
PASSWORDS = {f"{name.upper().replace('-', '_')}_NATS_PASSWORD": f"p{name.replace('-', '')}0123456789"
             for name in (*SERVICES, "website", "operator", "module-events")}
"""A password per NATS user, as an operator's .env would give them."""


def _compose_config(*files: str) -> dict[str, Any]:
    env = {**os.environ, "SHARD_TOKEN": "x" * 24, "WEB_TOKEN": "y" * 24, **PASSWORDS}
    args = [arg for name in files for arg in ("-f", str(ROOT / name))]
    done = subprocess.run([*COMPOSE_CMD, *args, "config"], capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 0, done.stderr
    return yaml.safe_load(done.stdout)


@needs_compose
def test_docker_compose_accepts_the_file():
    assert {"nats", "gateway"} <= set(_compose_config("compose.yaml")["services"])


# --- the cluster override (compose.cluster.yaml) ---------------------------------------------

def interpolate(value: str, env: dict[str, str]) -> str:
    """Compose's ``${NAME}``, ``${NAME:-default}`` and ``${NAME:?error}`` against ``env``."""
    def one(match: re.Match[str]) -> str:
        name, op, arg = match.group(1), match.group(2), match.group(3) or ""
        if env.get(name):
            return env[name]
        if op == ":?":
            raise KeyError(f"{name}: {arg}")
        return arg if op == ":-" else ""
    return re.sub(r"\$\{(\w+)(?:(:-|:\?)([^}]*))?\}", one, value)


MERGED_MAPPINGS = {"environment", "depends_on", "healthcheck", "networks"}


def merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """One service as compose merges an override file into it (the keys these files use):
    mappings merged key by key, volumes by their target, anything else replaced."""
    merged = dict(base)
    for key, value in override.items():
        if key in MERGED_MAPPINGS and isinstance(base.get(key), dict):
            merged[key] = {**base[key], **value}
        elif key == "volumes":
            by_target = {v.split(":")[1]: v for v in base.get(key, [])}
            by_target.update({v.split(":")[1]: v for v in value})
            merged[key] = list(by_target.values())
        else:
            merged[key] = value
    return merged


def cluster_service(name: str) -> dict[str, Any]:
    return merge(COMPOSE["services"].get(name, {}), CLUSTER["services"].get(name, {}))


def nats_urls(service: dict[str, Any]) -> list[Any]:
    """The service's SHARDBUS_NATS_URL, interpolated with ``PASSWORDS``, split and parsed."""
    value = interpolate(service["environment"]["SHARDBUS_NATS_URL"], PASSWORDS)
    return [urlsplit(url.strip()) for url in value.split(",") if url.strip()]


def node_routes() -> list[str]:
    block = re.search(r"^cluster \{(.*?)^\}", NODE_CONFIG.read_text(), re.S | re.M).group(1)
    return re.findall(r"nats-route://([\w.-]+):6222", block)


def test_the_cluster_override_rewires_the_services_and_adds_two_nodes():
    # (and points the monitoring profile's NATS exporter at the three nodes: tests/deploy)
    assert set(CLUSTER["services"]) == {*NODES, *SERVICES, "nats-exporter"}
    added = set(CLUSTER["services"]) - set(COMPOSE["services"])
    assert added == {"nats-2", "nats-3"}
    assert set(CLUSTER["volumes"]) == {"nats-1-data", "nats-2-data", "nats-3-data"}


@pytest.mark.parametrize("name", SERVICES)
def test_on_the_cluster_each_service_lists_every_node_with_its_own_user(name):
    service = cluster_service(name)
    urls = nats_urls(service)
    password = PASSWORDS[f"{name.upper()}_NATS_PASSWORD"]
    assert [(u.scheme, u.username, u.password, u.port) for u in urls] == [("nats", name, password, 4222)] * 3
    assert sorted(u.hostname for u in urls) == sorted(NODES.values())
    assert service["environment"]["SHARDBUS_JETSTREAM_REPLICAS"] == "3"
    assert {dep: cond["condition"] for dep, cond in service["depends_on"].items()} == {
        **{node: "service_healthy" for node in NODES}, "migrate": "service_completed_successfully"}
    known = all_settings()
    assert [env for env in service["environment"] if env not in known] == []
    # Everything else a service sets is compose.yaml's: the override only rewires NATS.
    assert set(CLUSTER["services"][name]["environment"]) == {"SHARDBUS_NATS_URL", "SHARDBUS_JETSTREAM_REPLICAS"}


def test_the_single_node_services_use_their_own_user_too():
    for name in SERVICES:
        urls = nats_urls(COMPOSE["services"][name])
        assert [(u.username, u.hostname) for u in urls] == [(name, "nats")]


def test_every_cluster_node_runs_the_node_config_with_its_own_name_and_store():
    single = COMPOSE["services"]["nats"]
    password_vars = {k: v for k, v in single["environment"].items() if k.endswith("_NATS_PASSWORD")}
    assert set(password_vars) == set(PASSWORDS)  # every user's password reaches the server
    stores = set()
    for service_name, host in NODES.items():
        node = cluster_service(service_name)
        assert node["command"] == ["-c", "/etc/nats/cluster-node.conf"]
        assert re.fullmatch(r"\$\{NATS_IMAGE:-nats:2\.1\d[^}]*\}", node["image"]), node["image"]
        env = node["environment"]
        assert env["NATS_SERVER_NAME"] == host
        # Same users on every node: the same password variables, with the same values.
        assert {k: v for k, v in env.items() if k.endswith("_NATS_PASSWORD")} == password_vars
        mounts = {v.split(":")[1]: v.split(":")[0] for v in node["volumes"]}
        configs = {target: source for target, source in mounts.items() if target.startswith("/etc/nats")}
        assert configs in ({"/etc/nats": "./deploy/nats"},
                           {"/etc/nats/nats.conf": "./deploy/nats/nats.conf",
                            "/etc/nats/cluster-node.conf": "./deploy/nats/cluster-node.conf"})
        stores.add(mounts["/data"])
        # Reachable under its name: the routes and the services' URLs use it.
        assert service_name == host or host in node["networks"]["default"]["aliases"]
        assert "/healthz" in node["healthcheck"]["test"][-1]
    assert stores == {"nats-1-data", "nats-2-data", "nats-3-data"}


def test_the_node_config_routes_to_the_three_nodes_and_takes_its_users_from_nats_conf():
    text = NODE_CONFIG.read_text()
    assert sorted(node_routes()) == sorted(NODES.values())
    assert re.search(r"^include \./nats\.conf$", text, re.M)
    assert re.search(r"^server_name: \$NATS_SERVER_NAME$", text, re.M)
    code = "\n".join(line.split("#")[0] for line in text.splitlines())
    assert "authorization" not in code and "users" not in code and "_NATS_PASSWORD" not in code


@needs_compose
def test_docker_compose_merges_the_cluster_override_as_these_tests_do():
    merged = _compose_config("compose.yaml", "compose.cluster.yaml")["services"]
    # docker-compose v1 lists the `monitoring` profile's services too (v2 only with --profile).
    monitoring = {name for name, svc in merged.items() if "monitoring" in svc.get("profiles", [])}
    assert {*NODES, *SERVICES, "postgres", "migrate"} == set(merged) - monitoring
    for name in SERVICES:
        urls = [urlsplit(u) for u in merged[name]["environment"]["SHARDBUS_NATS_URL"].split(",")]
        assert {(u.username, u.password, u.hostname) for u in urls} == {
            (name, PASSWORDS[f"{name.upper()}_NATS_PASSWORD"], host) for host in NODES.values()}
        assert str(merged[name]["environment"]["SHARDBUS_JETSTREAM_REPLICAS"]) == "3"
        assert set(NODES) <= set(merged[name]["depends_on"])
    for service_name, host in NODES.items():
        node = merged[service_name]
        assert node["environment"]["NATS_SERVER_NAME"] == host
        assert {k: v for k, v in node["environment"].items() if k.endswith("_NATS_PASSWORD")} == PASSWORDS
        data = [v for v in node["volumes"] if (v["target"] if isinstance(v, dict) else v.split(":")[1]) == "/data"]
        assert len(data) == 1, node["volumes"]  # the override's store replaced the single node's
