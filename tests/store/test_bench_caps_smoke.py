"""``python -m stress bench-caps`` runs end to end at a tiny size, on each engine."""

from __future__ import annotations

import argparse
import json

import pytest

from stress import bench_caps
from tests.support.databases import postgres_base_url


@pytest.mark.parametrize("engine", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def test_bench_caps_runs_and_reports_work(engine: str, capsys: pytest.CaptureFixture) -> None:
    parser = argparse.ArgumentParser()
    bench_caps.add_arguments(parser)
    argv = ["--engine", engine, "--depths", "50", "--tenants", "5", "--cycles", "5", "--json"]
    if engine == "postgres":
        argv += ["--postgres-url", postgres_base_url()]
    assert bench_caps.run(parser.parse_args(argv)) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert len(rows) == 14 and {r["claim"] for r in rows} >= {"plain", "pool full", "rate held"}
    capped = [r for r in rows if r["claim"] == "pool cap"]
    key = "vm_instructions" if engine == "sqlite" else "buffers"
    assert all(r[key] > 0 for r in capped)
