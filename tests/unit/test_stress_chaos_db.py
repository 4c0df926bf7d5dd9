"""``python -m stress chaos --allow-db-restart`` without restarting anything: which runs may ask
for it (PostgreSQL on this host only, with a cluster under /etc/postgresql), which cluster it
restarts, and how many restarts the schedule holds. tests/integration/test_chaos.py restarts a
real server."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from stress import chaos, chaos_db
from stress.chaos_db import Cluster, NotRestartable, cluster_for

LOCAL = "postgresql://postgres@127.0.0.1/test"


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    chaos.add_arguments(parser)
    return parser.parse_args(list(argv))


@pytest.fixture
def etc(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A /etc/postgresql with one cluster, 15/main on port 5432 (and the tools on PATH)."""
    monkeypatch.setattr(chaos_db.shutil, "which", lambda tool: f"/usr/bin/{tool}")
    (tmp_path / "15" / "main").mkdir(parents=True)
    (tmp_path / "15" / "main" / "postgresql.conf").write_text("port = 5432\n")
    return tmp_path


def test_the_only_cluster_is_the_one_restarted(etc: Path) -> None:
    cluster = cluster_for(LOCAL, etc)
    assert cluster == Cluster("15", "127.0.0.1", 5432)
    assert cluster.command("restart")[1:] == ["--skip-systemctl-redirect", "15", "main", "restart"]
    assert cluster.ready_command() == ["pg_isready", "-h", "127.0.0.1", "-p", "5432", "-t", "1"]
    assert cluster_for("postgresql:///test", etc).ready_command()[:2] == ["pg_isready", "-p"]


def test_with_several_versions_the_port_chooses(etc: Path) -> None:
    (etc / "16" / "main").mkdir(parents=True)
    (etc / "16" / "main" / "postgresql.conf").write_text("#port = 1\n  port = 5433  # x\n")
    assert cluster_for(LOCAL.replace("127.0.0.1", "127.0.0.1:5433"), etc).version == "16"
    assert cluster_for(LOCAL, etc).version == "15"
    with pytest.raises(NotRestartable, match="no single cluster 'main' with port 5999"):
        cluster_for(LOCAL.replace("127.0.0.1", "127.0.0.1:5999"), etc)


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("sqlite:///chaos.db", "needs PostgreSQL"),
        ("postgresql://u@db.example.com/x", "the database is on db.example.com"),
        ("not a url", "is not a database URL"),
    ],
)
def test_a_database_the_harness_cannot_restart_is_refused(etc: Path, url: str, reason: str) -> None:
    with pytest.raises(NotRestartable, match=reason):
        cluster_for(url, etc)


def test_no_cluster_or_no_tools_is_refused(etc: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(NotRestartable, match="no single cluster 'main' with port 5432"):
        cluster_for(LOCAL, etc / "missing")
    monkeypatch.setattr(chaos_db.shutil, "which", lambda tool: None)
    with pytest.raises(NotRestartable, match="pg_ctlcluster is not on PATH"):
        cluster_for(LOCAL, etc)


def test_the_flag_is_off_by_default_and_only_for_postgres(etc: Path) -> None:
    assert chaos.restartable(parse("--database", "postgres"), etc) is None
    assert chaos.Settings.from_args(parse("--database", "postgres")).db_restarts == 0
    with pytest.raises(NotRestartable, match="not sqlite"):
        chaos.restartable(parse("--allow-db-restart"), etc)  # --database sqlite, the default
    # --database postgres: the server of --postgres-url; or the URL given as --database
    args = parse("--allow-db-restart", "--database", "postgres", "--postgres-url", LOCAL)
    assert chaos.restartable(args, etc) == Cluster("15", "127.0.0.1", 5432)
    args = parse("--allow-db-restart", "--database", "postgresql://u@localhost:5432/x")
    assert chaos.restartable(args, etc) == Cluster("15", "localhost", 5432)


def test_restarts_follow_the_duration_like_the_other_faults() -> None:
    def restarts(*argv: str) -> int:
        return chaos.Settings.from_args(parse("--allow-db-restart", *argv)).db_restarts

    assert restarts("--short") == 1
    assert restarts() == 3  # the 900 s default
    assert restarts("--duration", "240") == 2
    assert restarts("--duration", "240", "--db-restarts", "5") == 5
