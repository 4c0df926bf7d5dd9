"""The deploy recipes in conf/ parse, keep their promises (stop timeouts above the grace
period, KillMode=mixed, the KEDA trigger on the oldest job's age, the dashboard's panels), and
use only metric names fleetd exports."""

from __future__ import annotations

import configparser
import json
import re
from pathlib import Path

import pytest
import yaml

from supervisor.config import load_config, parse_config
from supervisor.observe.metrics import METRICS

ROOT = Path(__file__).resolve().parents[2]
CONF = ROOT / "conf"
RECIPES = [
    CONF / "systemd" / "fleetd.service",
    CONF / "kubernetes" / "deployment.yaml",
    CONF / "kubernetes" / "keda-scaledobject.yaml",
    CONF / "grafana" / "fleetd-dashboard.json",
]
METRIC = re.compile(r"\bfleetd_[a-z_]+\b")


def exported() -> set[str]:
    names = set()
    for m in METRICS:
        names.add(m.name)
        if m.kind == "histogram":
            names |= {m.name + s for s in ("_bucket", "_count", "_sum")}
    return names


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: p.name)
def test_every_metric_a_recipe_uses_is_exported(path: Path) -> None:
    used = set(METRIC.findall(path.read_text()))
    assert not used - exported(), f"{path.name} uses metrics fleetd does not export"


def unit() -> configparser.ConfigParser:
    parser = configparser.ConfigParser(interpolation=None, strict=False)
    parser.optionxform = str  # type: ignore[assignment,method-assign]
    parser.read(CONF / "systemd" / "fleetd.service")
    return parser


def test_the_systemd_unit_stops_after_the_grace_period() -> None:
    service = unit()["Service"]
    grace = load_config(CONF / "fleet.example.toml").grace_period
    assert service["KillMode"] == "mixed"
    assert service["KillSignal"] == "SIGTERM"
    assert float(service["TimeoutStopSec"]) > grace + 10  # + the last writes' patience
    assert "fleetd start -c" in service["ExecStart"]


def documents() -> list[dict]:
    return list(yaml.safe_load_all((CONF / "kubernetes" / "deployment.yaml").read_text()))


def test_the_deployment_outlives_the_grace_period_and_probes_healthz() -> None:
    by_kind = {d["kind"]: d for d in documents()}
    text = by_kind["ConfigMap"]["data"]["fleet.toml"]
    config = parse_config(
        text, "/etc/fleetd/fleet.toml", {"FLEETD_DATABASE_URL": "postgresql://db/fleet"}
    )
    pod = by_kind["Deployment"]["spec"]["template"]["spec"]
    assert pod["terminationGracePeriodSeconds"] > config.grace_period + 10
    [container] = pod["containers"]
    probe = container["livenessProbe"]["httpGet"]
    assert probe["path"] == "/healthz"
    [port] = [p for p in container["ports"] if p["name"] == probe["port"]]
    assert config.metrics_address == ("0.0.0.0", port["containerPort"])
    raw = (CONF / "kubernetes" / "deployment.yaml").read_text()
    assert re.search(r"#.*grace_period", raw), "the reason for the grace period is a comment"


def test_keda_scales_on_the_oldest_job_age() -> None:
    [scaled] = yaml.safe_load_all((CONF / "kubernetes" / "keda-scaledobject.yaml").read_text())
    assert scaled["kind"] == "ScaledObject"
    assert scaled["spec"]["scaleTargetRef"]["name"] == "fleetd"
    [trigger] = scaled["spec"]["triggers"]
    assert trigger["type"] == "prometheus"
    assert "fleetd_oldest_job_age_seconds" in trigger["metadata"]["query"]
    assert float(trigger["metadata"]["threshold"]) > 0


def test_the_dashboard_has_the_panels_the_seed_asks_for() -> None:
    dashboard = json.loads((CONF / "grafana" / "fleetd-dashboard.json").read_text())
    panels = {p["title"]: p for p in dashboard["panels"]}
    wanted = {
        "Oldest job age vs latency target": {"fleetd_oldest_job_age_seconds"},
        "Throughput vs arrival": {"fleetd_jobs_finished_total", "fleetd_jobs_enqueued_total"},
        "Redeliveries and lease expiries": {
            "fleetd_redeliveries_total",
            "fleetd_lease_expiries_total",
        },
        "Effective vs provisioned concurrency": {"fleetd_workers"},
        "Dead-letter rate": {"fleetd_dead_letters_total"},
    }
    for title, names in wanted.items():
        assert title in panels, title
        exprs = " ".join(t["expr"] for t in panels[title]["targets"])
        assert names <= set(METRIC.findall(exprs)), title
    assert 'state="busy"' in " ".join(
        t["expr"] for t in panels["Effective vs provisioned concurrency"]["targets"]
    )
