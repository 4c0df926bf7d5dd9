"""conf/prometheus/alerts.yml: every alert the issue names, checked and unit-tested by
promtool (``promtool check rules``, ``promtool test rules`` on alerts.test.yml: a firing and a
silent case per alert) when promtool is installed (.ci/run installs it), and every metric a
rule reads is one fleetd exports."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from supervisor.observe import metrics

RULES = Path(__file__).resolve().parents[2] / "conf" / "prometheus"
ALERTS = {
    "FleetdOldestJobPastTarget",  # the oldest job's age past the pool's latency target
    "FleetdDeadLetters",  # a sustained non-zero dead-letter rate
    "FleetdLeaseExpiries",
    "FleetdPoolSaturated",
    "FleetdNodeUnhealthy",  # an unhealthy or stalled node
    "FleetdNodeDown",
    "FleetdStoreDown",  # a store that is down (or stalled)
    "FleetdPoolPausedForLong",
}


def rules() -> list[dict[str, object]]:
    doc = yaml.safe_load((RULES / "alerts.yml").read_text())
    return [rule for group in doc["groups"] for rule in group["rules"]]


def test_every_alert_is_there_and_reads_only_metrics_fleetd_exports() -> None:
    assert {r["alert"] for r in rules()} == ALERTS
    for rule in rules():
        used = set(re.findall(r"\b(fleetd_[a-z_]+)", str(rule["expr"])))
        assert used <= metrics.NAMES, (rule["alert"], used - metrics.NAMES)


def test_every_alert_has_a_firing_and_a_silent_case() -> None:
    tests = yaml.safe_load((RULES / "alerts.test.yml").read_text())["tests"]
    cases = [c for t in tests for c in t["alert_rule_test"]]
    for alert in ALERTS:
        mine = [c for c in cases if c["alertname"] == alert]
        assert any(c["exp_alerts"] for c in mine), f"{alert}: no case where it fires"
        # silent: an evaluation that expects no alert at all (promtool fails the test if the
        # rule fires there), not merely other series staying quiet beside a firing one
        assert any(c["exp_alerts"] == [] for c in mine), f"{alert}: no case where it is silent"


def _promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        pytest.skip("promtool is not installed (Debian: apt-get install prometheus)")
    return found


@pytest.mark.parametrize(
    "command", [["check", "rules", "alerts.yml"], ["test", "rules", "alerts.test.yml"]]
)
def test_promtool(command: list[str]) -> None:
    out = subprocess.run(
        [_promtool(), *command], cwd=RULES, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stdout + out.stderr


def test_the_dashboard_shows_paused_pools_and_cancelled_jobs() -> None:
    import json

    dashboard = json.loads((RULES.parent / "grafana" / "fleetd-dashboard.json").read_text())
    exprs = {p["title"]: " ".join(t["expr"] for t in p["targets"]) for p in dashboard["panels"]}
    assert "fleetd_pool_paused" in exprs["Paused pools"]
    assert 'outcome="cancelled"' in exprs["Cancelled jobs"]
    assert "fleetd_cancelled_jobs" in exprs["Cancelled jobs"]
