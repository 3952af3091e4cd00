"""deploy/prometheus: promtool accepts the configuration and the rules, every alert's unit
test passes (alerts_test.yml), and those unit tests can fail: an alert that never fires, or
one that always does, is caught. The alerts name only catalogued series and point at a real
section of docs/operations.md."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
import yaml

from tests.deploy import catalogue
from tests.deploy.conftest import PROMETHEUS_DIR, ROOT, run_promtool
from tests.deploy.promql import reads

CONFIG = yaml.safe_load((PROMETHEUS_DIR / "prometheus.yml").read_text())
RULES = yaml.safe_load((PROMETHEUS_DIR / "alerts.yml").read_text())
RULE_TESTS = yaml.safe_load((PROMETHEUS_DIR / "alerts_test.yml").read_text())
ALERTS = {rule["alert"]: rule for group in RULES["groups"] for rule in group["rules"]}
CATALOGUE_ALERTS = {"ShardSilent", "DeadLettersRising", "RunsIncomplete", "RunsWaitingTooLong", "RelayLag",
                    "ServiceDown"}
OPERATIONS = ROOT / "docs" / "operations.md"


def test_promtool_accepts_the_configuration(promtool):
    done = run_promtool(promtool, "check", "config", "prometheus.yml")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS: 1 rule files found" in done.stdout


def test_promtool_accepts_the_rules(promtool):
    done = run_promtool(promtool, "check", "rules", "alerts.yml")
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {len(ALERTS)} rules found" in done.stdout


def test_every_alert_unit_test_passes(promtool):
    done = run_promtool(promtool, "test", "rules", "alerts_test.yml")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout


def test_the_alerts_are_the_catalogues_six():
    assert set(ALERTS) == CATALOGUE_ALERTS


@pytest.mark.parametrize("name", sorted(CATALOGUE_ALERTS))
def test_each_alert_is_shown_to_fire_and_to_stay_quiet(name):
    cases = [case for test in RULE_TESTS["tests"] for case in test["alert_rule_test"] if case["alertname"] == name]
    assert any(case["exp_alerts"] for case in cases), f"no unit test where {name} fires"
    assert any(not case["exp_alerts"] for case in cases), f"no unit test where {name} stays quiet"


def _mutated_rules_fail(promtool, tmp_path: Path, name: str, expr: str) -> str:
    """promtool test rules' output with ``name``'s expression replaced by ``expr``."""
    rules = yaml.safe_load((PROMETHEUS_DIR / "alerts.yml").read_text())
    for group in rules["groups"]:
        for rule in group["rules"]:
            if rule["alert"] == name:
                rule["expr"] = expr
    (tmp_path / "alerts.yml").write_text(yaml.safe_dump(rules))
    shutil.copy(PROMETHEUS_DIR / "alerts_test.yml", tmp_path)
    done = run_promtool(promtool, "test", "rules", "alerts_test.yml", cwd=tmp_path)
    assert done.returncode != 0, f"the unit tests still pass with {name}: {expr}"
    return done.stdout + done.stderr


@pytest.mark.parametrize("name", sorted(CATALOGUE_ALERTS))
def test_the_unit_tests_fail_if_an_alert_never_fires(promtool, tmp_path, name):
    assert f"alertname: {name}" in _mutated_rules_fail(promtool, tmp_path, name, "vector(0) > 1")


@pytest.mark.parametrize("name", sorted(CATALOGUE_ALERTS))
def test_the_unit_tests_fail_if_an_alert_always_fires(promtool, tmp_path, name):
    assert f"alertname: {name}" in _mutated_rules_fail(promtool, tmp_path, name, "vector(1)")


def test_the_alerts_name_only_catalogued_series_and_their_labels():
    wrong = {}
    for name, rule in ALERTS.items():
        found = reads(rule["expr"])
        unknown = sorted(set(found.series) - set(catalogue.SERIES))
        bad_labels = sorted(f"{series}{{{label}}}" for series, labels in found.series.items()
                            for label in labels - catalogue.SERIES.get(series, frozenset()) - catalogue.TARGET_LABELS)
        known = set().union(*(catalogue.SERIES.get(s, frozenset()) for s in found.series), catalogue.TARGET_LABELS)
        if unknown or bad_labels or found.grouping - known:
            wrong[name] = (unknown, bad_labels, sorted(found.grouping - known))
    assert wrong == {}


def _anchors(markdown: str) -> set[str]:
    """GitHub's anchors of the headings of ``markdown``."""
    headings = re.findall(r"^#{1,6} (.+?)\s*$", markdown, re.M)
    return {re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-") for heading in headings}


@pytest.mark.parametrize("name", sorted(CATALOGUE_ALERTS))
def test_each_alert_says_what_and_names_its_runbook_section(name):
    annotations = ALERTS[name]["annotations"]
    assert annotations["summary"].strip() and annotations["description"].strip()
    page, _, anchor = annotations["runbook"].partition("#")
    assert page == "docs/operations.md"
    assert anchor in _anchors(OPERATIONS.read_text()), f"no section #{anchor} in docs/operations.md"
    assert ALERTS[name]["labels"]["severity"] in {"warning", "critical"}


def test_the_scrape_jobs_are_one_per_service_found_through_dns_on_the_metrics_port():
    jobs = {job["job_name"]: job for job in CONFIG["scrape_configs"]}
    for service in catalogue.SERVICES:
        assert jobs[service]["dns_sd_configs"] == [
            {"names": [service], "type": "A", "port": 9464, "refresh_interval": "30s"}]
    assert [j for j in jobs if j not in {*catalogue.SERVICES, "nats", "postgres", "prometheus"}] == []
    assert CONFIG["rule_files"] == ["alerts.yml"]


def test_the_service_down_alert_watches_exactly_the_service_jobs():
    selector = re.search(r'job=~"([^"]+)"', ALERTS["ServiceDown"]["expr"])
    assert selector and set(selector.group(1).split("|")) == set(catalogue.SERVICES)
