"""deploy/grafana: the committed dashboard parses, reads only catalogued series (with their
labels) from the provisioned datasource, shows every series of the services, and Grafana's
provisioning files point where compose mounts them."""

from __future__ import annotations

import json

import pytest
import yaml

from tests.deploy import catalogue
from tests.deploy.conftest import ROOT
from tests.deploy.promql import reads

GRAFANA = ROOT / "deploy" / "grafana"
DASHBOARD = json.loads((GRAFANA / "dashboards" / "shardbus.json").read_text())
DATASOURCES = yaml.safe_load((GRAFANA / "provisioning" / "datasources" / "prometheus.yaml").read_text())
PROVIDERS = yaml.safe_load((GRAFANA / "provisioning" / "dashboards" / "shardbus.yaml").read_text())
COMPOSE = yaml.safe_load((ROOT / "compose.yaml").read_text())
PANELS = [panel for panel in DASHBOARD["panels"] if panel["type"] != "row"]
EXPRESSIONS = [(panel["title"], target["expr"]) for panel in PANELS for target in panel["targets"]]


def test_the_dashboard_has_panels_each_with_a_query_on_the_provisioned_datasource():
    uid = DATASOURCES["datasources"][0]["uid"]
    assert DASHBOARD["uid"] and DASHBOARD["title"] and len(PANELS) >= 20
    for panel in PANELS:
        assert panel["targets"], panel["title"]
        assert panel["datasource"]["uid"] == uid
        assert all(target["datasource"]["uid"] == uid for target in panel["targets"])
    assert len({panel["id"] for panel in DASHBOARD["panels"]}) == len(DASHBOARD["panels"])


@pytest.mark.parametrize(("title", "expr"), EXPRESSIONS, ids=[f"{t}:{i}" for i, (t, _) in enumerate(EXPRESSIONS)])
def test_each_query_names_only_catalogued_series_and_labels(title, expr):
    found = reads(expr)
    assert sorted(set(found.series) - set(catalogue.SERIES)) == []
    for series, labels in found.series.items():
        assert labels - catalogue.SERIES[series] - catalogue.TARGET_LABELS == set(), series
    known = set().union(*(catalogue.SERIES[s] for s in found.series), catalogue.TARGET_LABELS)
    assert found.grouping - known == set()


def test_every_series_of_the_services_is_on_the_dashboard():
    shown = {catalogue.base_name(series) for _, expr in EXPRESSIONS for series in reads(expr).series}
    ours = {catalogue.base_name(series) for series in catalogue.OURS}
    assert sorted(ours - shown) == []
    assert {"process_cpu_seconds_total", "process_resident_memory_bytes"} <= shown
    assert any(s.startswith("gnatsd_") for s in shown) and any(s.startswith("jetstream_") for s in shown)
    assert any(s.startswith("pg_") for s in shown)


@pytest.mark.parametrize("histogram", ["shardbus_gateway_command_duration_seconds",
                                       "shardbus_web_request_duration_seconds",
                                       "shardbus_cleanup_sweep_duration_seconds"])
def test_latencies_are_shown_as_p50_and_p99(histogram):
    exprs = [expr for _, expr in EXPRESSIONS if f"{histogram}_bucket" in expr]
    assert any(expr.startswith("histogram_quantile(0.5,") for expr in exprs)
    assert any(expr.startswith("histogram_quantile(0.99,") for expr in exprs)


def test_the_provisioning_points_where_compose_mounts_it():
    grafana = COMPOSE["services"]["grafana"]
    mounts = {v.split(":")[1]: v.split(":")[0] for v in grafana["volumes"]}
    assert mounts["/etc/grafana/provisioning"] == "./deploy/grafana/provisioning"
    path = PROVIDERS["providers"][0]["options"]["path"]
    assert mounts[path] == "./deploy/grafana/dashboards"
    assert DATASOURCES["datasources"][0]["url"] == "http://prometheus:9090"
