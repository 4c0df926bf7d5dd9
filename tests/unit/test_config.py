"""supervisor.config: fleet.toml -> FleetConfig, every rule, and the shape of every error."""

from __future__ import annotations

from pathlib import Path

import pydantic
import pytest

from supervisor.config import example_toml, load_config, parse_config
from supervisor.config.fleet import FleetConfig, MemoryBudget
from supervisor.config.pool import PoolConfig
from supervisor.config.schedule import ScheduleConfig
from supervisor.errors import ConfigError, UnknownKind
from workers.command_rules import CommandSpec

MiB, GiB = 2**20, 2**30
EXAMPLE = Path(__file__).resolve().parents[2] / "conf" / "fleet.example.toml"
BULK = '[pools.bulk]\nhandlers = { render = "app.pdf:render", reindex = "app.jobs:reindex" }\n'


def write(tmp_path: Path, text: str, name: str = "fleet.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def load(tmp_path: Path, text: str, environ: dict[str, str] | None = None) -> FleetConfig:
    return load_config(write(tmp_path, text), environ=environ or {})


def bulk(tmp_path: Path, lines: str) -> PoolConfig:
    return load(tmp_path, BULK + lines).pools["bulk"]


def error(tmp_path: Path, text: str, environ: dict[str, str] | None = None) -> str:
    """The ConfigError's text, checked for the shape every config error shares."""
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as caught:
        load_config(path, environ=environ or {})
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith(f"{path}: ")
    assert "pydantic" not in message.lower() and "http" not in message
    assert caught.value.path == str(path)
    return message.removeprefix(f"{path}: ")


# ---- defaults ----


def test_fair_share_keys(tmp_path: Path) -> None:
    pool = bulk(tmp_path, "")
    assert pool.fair is True and pool.tenant_weights == {}
    pool = bulk(tmp_path, 'tenant_weights = { acme = 3, "" = 0.5 }')
    assert pool.tenant_weights == {"acme": 3.0, "": 0.5}
    assert bulk(tmp_path, "fair = false").fair is False


def test_pool_defaults(tmp_path: Path) -> None:
    pool = bulk(tmp_path, "")
    assert pool.name == "bulk"
    assert pool.handlers == {"render": "app.pdf:render", "reindex": "app.jobs:reindex"}
    assert pool.kinds == ("render", "reindex")
    expected = {
        "min_workers": 1,
        "max_workers": 4,
        "bound": "cpu",
        "memory_limit": 512 * MiB,
        "job_memory": 200 * MiB,
        "timeout": 60.0,
        "soft_timeout": 0.0,
        "lease": 60.0,
        "heartbeat": 20.0,
        "max_lease_extensions": 30,
        "max_deliveries": 3,
        "retry_backoff": 1.0,
        "retry_backoff_max": 600.0,
        "retry_budget": None,
        "latency_target": 300.0,
        "max_inflight": None,
        "tenant_max_inflight": None,
        "kind_max_inflight": {},
        "max_jobs_per_worker": 10_000,
        "recycle_rss": None,
        "prefetch": 0,
        "user": None,
        "group": None,
        "nproc_limit": None,
        "rate_limit": None,
        "kind_rate_limit": {},
        "rate_burst": None,
    }
    assert {key: getattr(pool, key) for key in expected} == expected


def test_fleet_defaults(tmp_path: Path) -> None:
    config = load(tmp_path, BULK)
    assert config.path == tmp_path / "fleet.toml"
    assert config.name == "fleet"
    assert config.database == f"sqlite:///{tmp_path}/fleetd.db"
    assert config.python_path == (tmp_path,)
    assert config.grace_period == 30.0
    assert config.metrics is None and config.metrics_address is None
    assert config.memory_budget == MemoryBudget(fraction=0.8)
    assert config.retention == 7 * 86400.0
    assert config.log_format == "human"


def test_name_defaults_to_the_file_stem(tmp_path: Path) -> None:
    assert load_config(write(tmp_path, BULK, "edge-eu.toml")).name == "edge-eu"
    assert load(tmp_path, '[fleet]\nname = "prod"\n' + BULK).name == "prod"


def test_heartbeat_defaults_to_a_third_of_the_lease(tmp_path: Path) -> None:
    assert bulk(tmp_path, 'lease = "90s"').heartbeat == 30.0
    assert bulk(tmp_path, 'lease = "90s"\nheartbeat = "10s"').heartbeat == 10.0
    direct = PoolConfig(name="p", handlers={"k": "m:f"}, lease="3s")
    assert direct.heartbeat == 1.0


# ---- accepted forms ----


@pytest.mark.parametrize(
    ("line", "key", "value"),
    [
        ('timeout = "250ms"', "timeout", 0.25),
        ('timeout = "5m"', "timeout", 300.0),
        ("timeout = 90", "timeout", 90.0),
        ("timeout = 1.5", "timeout", 1.5),
        ('latency_target = "1h"', "latency_target", 3600.0),
        ('soft_timeout = "2s"', "soft_timeout", 2.0),
        ("soft_timeout = 0", "soft_timeout", 0.0),
        ('memory_limit = "1GiB"', "memory_limit", GiB),
        ('memory_limit = "500MB"', "memory_limit", 500_000_000),
        ("memory_limit = 1048576", "memory_limit", MiB),
        ("memory_limit = false", "memory_limit", None),
        ('job_memory = "64KiB"', "job_memory", 64 * 1024),
        ('recycle_rss = "300MiB"', "recycle_rss", 300 * MiB),
        ('retry_budget = "10%"', "retry_budget", 0.1),
        ("retry_budget = 0.25", "retry_budget", 0.25),
        ("max_jobs_per_worker = false", "max_jobs_per_worker", None),
        ("max_jobs_per_worker = 1", "max_jobs_per_worker", 1),
        ('bound = "io"', "bound", "io"),
        ("min_workers = 0", "min_workers", 0),
        ("max_inflight = 50", "max_inflight", 50),
        ("tenant_max_inflight = 10", "tenant_max_inflight", 10),
        ("kind_max_inflight = { render = 5 }", "kind_max_inflight", {"render": 5}),
        ("prefetch = 2", "prefetch", 2),
        ("max_lease_extensions = 0", "max_lease_extensions", 0),
        ('user = "fleetd"', "user", "fleetd"),
        ('group = "fleetd"', "group", "fleetd"),
        ("nproc_limit = 64", "nproc_limit", 64),
        ('rate_limit = "50/s"', "rate_limit", 50.0),
        ('rate_limit = "600/m"', "rate_limit", 10.0),
        ("rate_limit = false", "rate_limit", None),
        ('rate_limit = "10/s"\nrate_burst = 3', "rate_burst", 3),
        ('kind_rate_limit = { render = "1/h" }', "kind_rate_limit", {"render": 1 / 3600}),
    ],
)
def test_pool_values(tmp_path: Path, line: str, key: str, value: object) -> None:
    assert getattr(bulk(tmp_path, line), key) == value


@pytest.mark.parametrize(
    ("line", "key", "value"),
    [
        ('grace_period = "2m"', "grace_period", 120.0),
        ('retention = "1d"', "retention", 86400.0),
        ('metrics = "127.0.0.1:9464"', "metrics", "127.0.0.1:9464"),
        ('metrics = "[::1]:0"', "metrics", "[::1]:0"),
        ('memory_budget = "50%"', "memory_budget", MemoryBudget(fraction=0.5)),
        ('memory_budget = "4GiB"', "memory_budget", MemoryBudget(size=4 * GiB)),
        ("memory_budget = 1073741824", "memory_budget", MemoryBudget(size=GiB)),
        ('log_format = "json"', "log_format", "json"),
    ],
)
def test_fleet_values(tmp_path: Path, line: str, key: str, value: object) -> None:
    assert getattr(load(tmp_path, f"[fleet]\n{line}\n" + BULK), key) == value


def test_metrics_address_is_split_for_bind(tmp_path: Path) -> None:
    assert load(tmp_path, '[fleet]\nmetrics = "0.0.0.0:9464"\n' + BULK).metrics_address == (
        "0.0.0.0",
        9464,
    )
    assert load(tmp_path, '[fleet]\nmetrics = "[::1]:80"\n' + BULK).metrics_address == ("::1", 80)


@pytest.mark.parametrize(
    ("budget", "total", "expected"),
    [
        (MemoryBudget(fraction=0.8), 10 * GiB, 8 * GiB),
        (MemoryBudget(fraction=0.5), 1001, 500),
        (MemoryBudget(size=4 * GiB), 16 * GiB, 4 * GiB),
        (MemoryBudget(size=4 * GiB), 2 * GiB, 4 * GiB),  # as configured, even above the host
    ],
)
def test_memory_budget_bytes_of(budget: MemoryBudget, total: int, expected: int) -> None:
    assert budget.bytes_of(total) == expected


def test_memory_budget_reads_back() -> None:
    assert str(MemoryBudget(fraction=0.8)) == "80%"
    assert str(MemoryBudget(size=4 * GiB)) == "4GiB"
    with pytest.raises(ValueError):
        MemoryBudget(fraction=0.5, size=1)


# ---- the database URL and paths ----


@pytest.mark.parametrize(
    ("url", "environ", "expected"),
    [
        ("sqlite:///fleetd.db", {}, "sqlite:///{dir}/fleetd.db"),
        ("sqlite:///data/q.db", {}, "sqlite:///{dir}/data/q.db"),
        ("sqlite:///../q.db", {}, "sqlite:///{parent}/q.db"),
        ("sqlite:////var/lib/fleetd/q.db", {}, "sqlite:////var/lib/fleetd/q.db"),
        ("sqlite:///q.db?timeout=30", {}, "sqlite:///{dir}/q.db?timeout=30"),
        ("sqlite+pysqlite:///q.db", {}, "sqlite+pysqlite:///{dir}/q.db"),
        ("${DB_URL}", {"DB_URL": "sqlite:///env.db"}, "sqlite:///{dir}/env.db"),
        ("postgresql://db.internal/jobs", {}, "postgresql://db.internal/jobs"),
        (
            "postgresql+psycopg://fleet:${PW}@db/jobs",
            {"PW": "s3cret"},
            "postgresql+psycopg://fleet:s3cret@db/jobs",
        ),
    ],
)
def test_database_url_is_resolved(
    tmp_path: Path, url: str, environ: dict[str, str], expected: str
) -> None:
    config = load(tmp_path, f'[fleet]\ndatabase = "{url}"\n' + BULK, environ)
    assert config.database == expected.format(dir=tmp_path, parent=tmp_path.parent)


def test_database_environment_defaults_to_os_environ(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FLEETD_TEST_DB", "postgresql://h/db")
    config = load_config(write(tmp_path, '[fleet]\ndatabase = "${FLEETD_TEST_DB}"\n' + BULK))
    assert config.database == "postgresql://h/db"


def test_relative_paths_follow_the_file_not_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "etc").mkdir()
    write(tmp_path / "etc", '[fleet]\npython_path = [".", "../src", "/opt/lib"]\n' + BULK)
    monkeypatch.chdir(tmp_path)
    config = load_config("etc/fleet.toml")
    assert config.path == tmp_path / "etc" / "fleet.toml"
    assert config.python_path == (tmp_path / "etc", tmp_path / "src", Path("/opt/lib"))
    assert config.database == f"sqlite:///{tmp_path}/etc/fleetd.db"
    assert all(path.is_absolute() for path in config.python_path)


def test_parse_config_reads_text(tmp_path: Path) -> None:
    config = parse_config(BULK, tmp_path / "x.toml", environ={})
    assert config.name == "x" and config.database == f"sqlite:///{tmp_path}/fleetd.db"


# ---- pools, kinds ----


def test_pools_keep_the_file_order(tmp_path: Path) -> None:
    text = '[pools.zeta]\nhandlers = { z = "m:z" }\n[pools.alpha]\nhandlers = { a = "m:a" }\n'
    config = load(tmp_path, text)
    assert list(config.pools) == ["zeta", "alpha"]
    assert config.kinds == ("z", "a")


def test_pool_for_kind(tmp_path: Path) -> None:
    config = load(tmp_path, BULK + '[pools.fast]\nhandlers = { ping = "app.net:ping" }\n')
    assert config.pool_for_kind("ping").name == "fast"
    assert config.pool_for_kind("render") is config.pools["bulk"]
    with pytest.raises(UnknownKind) as caught:
        config.pool_for_kind("rendr")
    message = str(caught.value)
    assert "'rendr'" in message and "'render', 'reindex', 'ping'" in message
    assert "\n" not in message


def test_configs_are_frozen(tmp_path: Path) -> None:
    config = load(tmp_path, BULK)
    with pytest.raises(pydantic.ValidationError):
        config.name = "other"  # type: ignore[misc]
    with pytest.raises(pydantic.ValidationError):
        config.pools["bulk"].timeout = 1.0  # type: ignore[misc]


def test_direct_construction_validates_too(tmp_path: Path) -> None:
    pool = PoolConfig(name="p", handlers={"k": "m:f"}, timeout="5s", memory_limit="1GiB")
    config = FleetConfig(path=tmp_path / "f.toml", pools={"p": pool})
    assert (pool.timeout, pool.memory_limit, config.name) == (5.0, GiB, "f")
    with pytest.raises(pydantic.ValidationError):
        PoolConfig(name="p", handlers={"k": "m:f"}, heartbeat="1m", lease="1m")


# ---- errors: each names file, key path, bad value and what was expected ----

VALUE_ERRORS = [
    # (toml, key path, fragments that must appear)
    ('memory_limit = "512 Mb"', "pools.bulk.memory_limit", ["'512 Mb' is not a size", '"512MiB"']),
    ("memory_limit = 0", "pools.bulk.memory_limit", ["0 is zero", "above zero"]),
    ("memory_limit = true", "pools.bulk.memory_limit", ["True is not a size"]),
    ('job_memory = "-1MiB"', "pools.bulk.job_memory", ["'-1MiB' is negative"]),
    ('recycle_rss = "lots"', "pools.bulk.recycle_rss", ["'lots' is not a size"]),
    ('timeout = "5 minutes"', "pools.bulk.timeout", ["'5 minutes' is not a duration", '"250ms"']),
    ('timeout = "0s"', "pools.bulk.timeout", ["'0s' is zero", "above zero"]),
    ("timeout = -1", "pools.bulk.timeout", ["-1 is negative"]),
    ("lease = 0", "pools.bulk.lease", ["0 is zero"]),
    ("heartbeat = 0", "pools.bulk.heartbeat", ["0 is zero"]),
    ('retry_backoff = "0ms"', "pools.bulk.retry_backoff", ["'0ms' is zero"]),
    ('retry_backoff_max = "x"', "pools.bulk.retry_backoff_max", ["'x' is not a duration"]),
    ("latency_target = 0", "pools.bulk.latency_target", ["0 is zero"]),
    ('soft_timeout = "-2s"', "pools.bulk.soft_timeout", ["'-2s' is negative"]),
    ("min_workers = -1", "pools.bulk.min_workers", ["-1 is too small", "integer >= 0"]),
    ('min_workers = "2"', "pools.bulk.min_workers", ["'2' is not an integer"]),
    ("max_workers = 0", "pools.bulk.max_workers", ["0 is too small", "integer >= 1"]),
    ("max_workers = 2.0", "pools.bulk.max_workers", ["2.0 is not an integer"]),
    ("max_deliveries = 0", "pools.bulk.max_deliveries", ["0 is too small"]),
    ("max_lease_extensions = -1", "pools.bulk.max_lease_extensions", ["-1 is too small"]),
    ("max_inflight = 0", "pools.bulk.max_inflight", ["0 is too small"]),
    ("tenant_max_inflight = 0", "pools.bulk.tenant_max_inflight", ["0 is too small"]),
    ("max_jobs_per_worker = 0", "pools.bulk.max_jobs_per_worker", ["0 is too small"]),
    ("prefetch = -1", "pools.bulk.prefetch", ["-1 is too small"]),
    ("nproc_limit = 0", "pools.bulk.nproc_limit", ["0 is too small"]),
    ('retry_budget = "120%"', "pools.bulk.retry_budget", ["'120%' is more than 100%"]),
    ('retry_budget = "0%"', "pools.bulk.retry_budget", ["'0%' is zero"]),
    ("retry_budget = 10", "pools.bulk.retry_budget", ["10 is more than 100%"]),
    ('bound = "gpu"', "pools.bulk.bound", ["'gpu' is not allowed", "'cpu' or 'io'"]),
    ('user = ""', "pools.bulk.user", ["'' is not valid"]),
    ("group = 7", "pools.bulk.group", ["7 is not valid"]),
    (
        "kind_max_inflight = { render = 0 }",
        "pools.bulk.kind_max_inflight.render",
        ["0 is too small"],
    ),
    (
        "kind_max_inflight = { rendr = 3 }",
        "pools.bulk.kind_max_inflight.rendr",
        ["'rendr' is not a kind of this pool", "'render', 'reindex'"],
    ),
    ('rate_limit = "50"', "pools.bulk.rate_limit", ["'50' is not a rate", '"50/s"']),
    ("rate_limit = 50", "pools.bulk.rate_limit", ["50 is not a rate"]),
    ('rate_limit = "0/s"', "pools.bulk.rate_limit", ["'0/s' is zero"]),
    ('rate_limit = "5/d"', "pools.bulk.rate_limit", ["'5/d' is not a rate"]),
    ('rate_limit = "-5/s"', "pools.bulk.rate_limit", ["'-5/s' is negative"]),
    ('rate_limit = "5/s"\nrate_burst = 0', "pools.bulk.rate_burst", ["0 is too small"]),
    ("rate_burst = 5", "pools.bulk.rate_burst", ["5 is set without a rate", "rate_limit too"]),
    (
        'kind_rate_limit = { render = "fast" }',
        "pools.bulk.kind_rate_limit.render",
        ["'fast' is not a rate"],
    ),
    (
        'kind_rate_limit = { rendr = "1/s" }',
        "pools.bulk.kind_rate_limit.rendr",
        ["'rendr' is not a kind of this pool"],
    ),
    # cross-field checks blame the key that is in the file
    ("min_workers = 5", "pools.bulk.min_workers", ["5 is above max_workers 4"]),
    (
        "min_workers = 3\nmax_workers = 2",
        "pools.bulk.min_workers",
        ["3 is above max_workers 2", "min_workers <= max_workers"],
    ),
    (
        'heartbeat = "60s"',
        "pools.bulk.heartbeat",
        ["'1m' is not below lease '1m'", "heartbeat < lease"],
    ),
    ('lease = "9s"\nheartbeat = "10s"', "pools.bulk.heartbeat", ["is not below lease '9s'"]),
    ('retry_backoff = "20m"', "pools.bulk.retry_backoff", ["'20m' is above retry_backoff_max"]),
    (
        'retry_backoff_max = "500ms"',
        "pools.bulk.retry_backoff_max",
        ["'500ms' is below retry_backoff '1s'", "retry_backoff <= retry_backoff_max"],
    ),
    # fair share
    ('fair = "no"', "pools.bulk.fair", ["'no' is not a boolean"]),
    ("tenant_weights = { acme = 0 }", "pools.bulk.tenant_weights.acme", ["0 is not a weight"]),
    ("tenant_weights = { acme = -2.5 }", "pools.bulk.tenant_weights.acme", ["-2.5 is not a"]),
    ('tenant_weights = { acme = "3" }', "pools.bulk.tenant_weights.acme", ["'3' is not a"]),
    ("tenant_weights = { acme = true }", "pools.bulk.tenant_weights.acme", ["True is not a"]),
    ("tenant_weights = { acme = inf }", "pools.bulk.tenant_weights.acme", ["a finite number"]),
    ("tenant_weights = { acme = nan }", "pools.bulk.tenant_weights.acme", ["nan is not a"]),
    ("tenant_weights = 3", "pools.bulk.tenant_weights", ["3 is not a table"]),
    # a weight this small overflowed the fair order's slot key: every claim of the pool failed
    ("tenant_weights = { acme = 1e-310 }", "pools.bulk.tenant_weights.acme", ["out of range"]),
    ("tenant_weights = { acme = 0.0009 }", "pools.bulk.tenant_weights.acme", ["0.001 to"]),
    (
        "tenant_weights = { acme = 1" + "0" * 400 + " }",
        "pools.bulk.tenant_weights.acme",
        ["out of range for a weight", "to 1,000,000"],
    ),
    (
        'tenant_weights = { "a b" = 2 }',
        'pools.bulk.tenant_weights."a b"',
        ["'a b' is not a tenant"],
    ),
    (
        "fair = false\nmax_inflight = 4",
        "pools.bulk.fair",
        ["false with max_inflight set", "always claims fairly"],
    ),
    (
        "fair = false\ntenant_weights = { acme = 2 }",
        "pools.bulk.fair",
        ["false with tenant_weights set"],
    ),
]


@pytest.mark.parametrize(("line", "key", "fragments"), VALUE_ERRORS)
def test_pool_value_errors(tmp_path: Path, line: str, key: str, fragments: list[str]) -> None:
    message = error(tmp_path, BULK + line + "\n")
    assert message.startswith(f"{key}: ")
    assert "(expected " in message and message.endswith(")")
    for fragment in fragments:
        assert fragment in message


FLEET_ERRORS = [
    ('grace_period = "0s"', "fleet.grace_period", ["'0s' is zero"]),
    ("retention = 0", "fleet.retention", ["0 is zero"]),
    ('retention = "forever"', "fleet.retention", ["'forever' is not a duration"]),
    ('metrics = "localhost"', "fleet.metrics", ["'localhost' is not a host:port address"]),
    ('metrics = "host:99999"', "fleet.metrics", ["'host:99999' is not a host:port"]),
    ("metrics = 9464", "fleet.metrics", ["9464 is not a host:port address"]),
    ('memory_budget = "120%"', "fleet.memory_budget", ["'120%' is more than 100%"]),
    ('memory_budget = "0%"', "fleet.memory_budget", ["'0%' is zero"]),
    ('memory_budget = "lots"', "fleet.memory_budget", ["'lots' is not a memory budget", '"80%"']),
    ("memory_budget = 0.8", "fleet.memory_budget", ["0.8 is not a memory budget"]),
    ('log_format = "xml"', "fleet.log_format", ["'xml' is not allowed", "'human' or 'json'"]),
    ('name = "my fleet"', "fleet.name", ["'my fleet' is not valid"]),
    ('python_path = "src"', "fleet.python_path", ["'src' is not a list of folders"]),
    ('python_path = [".", 3]', "fleet.python_path[1]", ["3 is not a folder"]),
    ("database = 5", "fleet.database", ["5 is not a database URL"]),
    ('database = "mysql://h/db"', "fleet.database", ["'mysql://h/db' is not a database URL"]),
    ('database = "postgres://h/db"', "fleet.database", ["'postgres://h/db' is not a database"]),
    ('database = "fleetd.db"', "fleet.database", ["'fleetd.db' is not a database URL"]),
    (
        'database = "sqlite:///:memory:"',
        "fleet.database",
        ["'sqlite:///:memory:' is not a database file", "must share it"],
    ),
    ('database = "sqlite://"', "fleet.database", ["'sqlite://' is not a database file"]),
    (
        'database = "sqlite:///file:q?mode=memory&uri=true"',
        "fleet.database",
        ["is not a database file"],
    ),
    (
        'database = "${FLEETD_DB}"',
        "fleet.database",
        ["'${FLEETD_DB}' uses the environment variable FLEETD_DB, which is not set"],
    ),
]


@pytest.mark.parametrize(("line", "key", "fragments"), FLEET_ERRORS)
def test_fleet_value_errors(tmp_path: Path, line: str, key: str, fragments: list[str]) -> None:
    message = error(tmp_path, f"[fleet]\n{line}\n" + BULK)
    assert message.startswith(f"{key}: ")
    assert "(expected " in message and message.endswith(")")
    for fragment in fragments:
        assert fragment in message


def test_expanded_database_url_is_never_shown(tmp_path: Path) -> None:
    text = '[fleet]\ndatabase = "${DB}"\n' + BULK
    message = error(tmp_path, text, environ={"DB": "mysql://u:hunter2@h/db"})
    assert "hunter2" not in message
    assert message.startswith("fleet.database: '${DB}' is not a database URL once expanded")


SHAPE_ERRORS = [
    # (whole file, key path, fragments)
    ("", "pools", ["no pools", "at least one [pools.NAME]"]),
    ("[fleet]\n", "pools", ["no pools"]),
    ("pools = 3\n", "pools", ["3 is not a table"]),
    ("[pools]\nbulk = 3\n", "pools.bulk", ["3 is not a table", "[pools.bulk]"]),
    ("fleet = 3\n" + BULK, "fleet", ["3 is not a table"]),
    ("[pools.bulk]\nmin_workers = 1\n", "pools.bulk.handlers", ["missing (expected"]),
    ("[pools.bulk]\nhandlers = {}\n", "pools.bulk.handlers", ["no handlers"]),
    ('[pools.bulk]\nhandlers = "app:f"\n', "pools.bulk.handlers", ["'app:f' is not a table"]),
    (
        '[pools.bulk]\nhandlers = { render = "app.pdf.render" }\n',
        "pools.bulk.handlers.render",
        ["'app.pdf.render' is not a handler", '"module:function"'],
    ),
    (
        '[pools.bulk]\nhandlers = { render = "app-x:render" }\n',
        "pools.bulk.handlers.render",
        ["'app-x:render' is not a handler"],
    ),
    (
        '[pools.bulk]\nhandlers = { render = "app:" }\n',
        "pools.bulk.handlers.render",
        ["'app:' is not a handler"],
    ),
    ("[pools.bulk]\nhandlers = { render = 3 }\n", "pools.bulk.handlers.render", ["3 is not a"]),
    (
        '[pools.bulk]\nhandlers = { "pdf render" = "app:r" }\n',
        'pools.bulk.handlers."pdf render"',
        ["'pdf render' is not a job kind"],
    ),
    (
        '[pools."my pool"]\nhandlers = { r = "app:r" }\n',
        'pools."my pool"',
        ["'my pool' is not a pool name", "[A-Za-z_][A-Za-z0-9_-]*"],
    ),
    ('[pools.2fast]\nhandlers = { r = "app:r" }\n', "pools.2fast", ["'2fast' is not a pool name"]),
    (
        BULK + '[pools.other]\nhandlers = { render = "app.v2:render" }\n',
        "pools.other.handlers.render",
        ["'render' is handled by pool 'bulk' and by pool 'other'", "exactly one pool"],
    ),
]


@pytest.mark.parametrize(("text", "key", "fragments"), SHAPE_ERRORS)
def test_shape_errors(tmp_path: Path, text: str, key: str, fragments: list[str]) -> None:
    message = error(tmp_path, text)
    assert message.startswith(f"{key}: ")
    assert "(expected " in message and message.endswith(")")
    for fragment in fragments:
        assert fragment in message


UNKNOWN_KEYS = [
    ('memry_limit = "1GiB"', "pools.bulk.memry_limit", "memory_limit"),
    ("max_worker = 3", "pools.bulk.max_worker", "max_workers"),
    ('timout = "1s"', "pools.bulk.timout", "timeout"),
    ('name = "bulk"', "pools.bulk.name", None),  # the table's name is not a key
    ("zzz = 1", "pools.bulk.zzz", None),
]


@pytest.mark.parametrize(("line", "key", "suggestion"), UNKNOWN_KEYS)
def test_unknown_pool_keys(tmp_path: Path, line: str, key: str, suggestion: str | None) -> None:
    message = error(tmp_path, BULK + line + "\n")
    assert message.startswith(f"{key}: unknown key (")
    assert "known: handlers, min_workers, max_workers, " in message
    assert "nproc_limit, private_shm, end_job_tree, rate_limit" in message
    if suggestion:
        assert f"did you mean {suggestion!r}?" in message
    else:
        assert "did you mean" not in message


@pytest.mark.parametrize(
    ("text", "key", "suggestion"),
    [
        ('[fleet]\ndatabse = "x"\n' + BULK, "fleet.databse", "database"),
        ('[fleet]\ngrace = "1s"\n' + BULK, "fleet.grace", "grace_period"),
        ("[fleet]\npools = 1\n" + BULK, "fleet.pools", None),
        ('[fleet]\npath = "x"\n' + BULK, "fleet.path", None),
        ("fleets = 1\n" + BULK, "fleets", "fleet"),
        ("[pool.bulk]\n" + BULK, "pool", "pools"),
    ],
)
def test_unknown_fleet_keys(tmp_path: Path, text: str, key: str, suggestion: str | None) -> None:
    message = error(tmp_path, text)
    assert message.startswith(f"{key}: unknown key (")
    assert ("known: fleet, pools, schedules)" in message) == ("." not in key)
    if suggestion:
        assert f"did you mean {suggestion!r}?" in message


@pytest.mark.parametrize(
    ("text", "where"),
    [
        ("[fleet\n", "line 1, column 7"),
        ("[fleet]\nname = = 1\n", "line 2, column 8"),
        (BULK + BULK, "line 3, column"),
        ('[fleet]\nname = "unterminated\n', "line 2, column"),
    ],
)
def test_malformed_toml(tmp_path: Path, text: str, where: str) -> None:
    message = error(tmp_path, text)
    assert message.startswith(where)
    assert ": invalid TOML: " in message


def test_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "nope.toml"
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    assert str(caught.value) == f"{path}: no such file (expected the path of a fleet.toml)"


def test_directory_instead_of_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as caught:
        load_config(tmp_path)
    assert str(caught.value).startswith(f"{tmp_path}: cannot be read: ")
    assert "\n" not in str(caught.value)


def test_not_utf8(tmp_path: Path) -> None:
    path = tmp_path / "fleet.toml"
    path.write_bytes(b'[fleet]\nname = "\xff"\n')
    with pytest.raises(ConfigError, match="is not UTF-8 text"):
        load_config(path)


def test_parse_config_errors_name_the_path(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config("[fleet\n", "conf/x.toml", environ={})
    assert str(caught.value).startswith("conf/x.toml: line 1, column 7: invalid TOML")


# ---- the example, rendered from the schema ----


def test_committed_example_matches_the_schema() -> None:
    regenerate = (
        "python -c 'from supervisor.config import example_toml; "
        'open("conf/fleet.example.toml", "w").write(example_toml())\''
    )
    assert EXAMPLE.read_text() == example_toml(), f"stale example; regenerate with: {regenerate}"


def test_example_loads() -> None:
    config = load_config(EXAMPLE, environ={})
    assert list(config.pools) == ["bulk", "interactive", "poison"]
    assert config.database == f"sqlite:///{EXAMPLE.parent}/fleetd.db"
    default = PoolConfig(name="d", handlers={"k": "m:f"})
    poison = config.pools["poison"]
    assert poison.memory_limit is not None and default.memory_limit is not None
    assert poison.memory_limit < default.memory_limit
    assert poison.timeout < default.timeout
    assert poison.max_deliveries < default.max_deliveries
    assert all(
        isinstance(ref, CommandSpec) or ref.startswith("app.")
        for pool in config.pools.values()
        for ref in pool.handlers.values()
    )
    assert poison.handlers["pdf_text"] == CommandSpec(
        ("pdftotext", "-layout", "{path}", "-"), 30.0, frozenset({1, 3})
    )


def test_example_documents_every_key() -> None:
    text = example_toml()
    tables = ((FleetConfig, {"path", "pools", "schedules"}), (PoolConfig, {"name"}))
    for model, not_keys in (*tables, (ScheduleConfig, {"name"})):
        for key, field in model.model_fields.items():
            if key in not_keys:
                continue
            assert f"\n{key} = " in text or f"\n# {key} = " in text, key
            assert f"# {field.description}" in text, key
    assert text.endswith("\n") and not text.endswith("\n\n")


# ---- schedules ----

REINDEX = '[pools.bulk]\nhandlers = { reindex = "app.jobs:reindex" }\n'


def schedule(lines: str) -> str:
    return REINDEX + '[schedules.nightly]\nkind = "reindex"\n' + lines


def test_schedule_defaults_and_spec(tmp_path: Path) -> None:
    config = load(tmp_path, schedule('cron = "0 2 * * *"\ntimezone = "Europe/Paris"\n'))
    s = config.schedules["nightly"]
    assert (s.catch_up, s.catch_up_max, s.overlap, s.payload) == ("once", 10, "skip", "{}")
    (spec,) = config.schedule_specs()
    assert (spec.pool, spec.max_deliveries, spec.timing.timezone) == ("bulk", 3, "Europe/Paris")
    every = load(tmp_path, schedule('every = "5m"\npayload = { full = true }\npriority = 2\n'))
    (spec,) = every.schedule_specs()
    assert spec.timing.every == 300 and spec.payload == '{"full":true}' and spec.priority == 2


SCHEDULE_ERRORS = [
    ('cron = "61 * * * *"\n', "schedules.nightly.cron", ["'61 * * * *' is not a cron", "minute"]),
    ('cron = "0 0 30 2 *"\n', "schedules.nightly.cron", ["day-of-month"]),
    ('cron = "@daily"\n', "schedules.nightly.cron", ["number of fields"]),
    ("", "schedules.nightly", ["neither cron nor every"]),
    ('cron = "0 2 * * *"\nevery = "1h"\n', "schedules.nightly.every", ["both cron and every"]),
    ('every = "1.5s"\n', "schedules.nightly.every", ["whole number of seconds"]),
    ('every = "0s"\n', "schedules.nightly.every", ["is zero"]),
    ('every = "367d"\n', "schedules.nightly.every", ["367 days is too long", "366 days"]),
    ('every = "3000000d"\n', "schedules.nightly.every", ["3000000 days is too long"]),
    (
        'cron = "0 2 * * *"\ntimezone = "Europe/Pariss"\n',
        "schedules.nightly.timezone",
        ["'Europe/Pariss' is not a time zone"],
    ),
    ('every = "1h"\ntimezone = "Europe/Paris"\n', "schedules.nightly.timezone", ["with every"]),
    ('every = "1h"\ncatch_up = "twice"\n', "schedules.nightly.catch_up", ["'twice'"]),
    ('every = "1h"\ncatch_up_max = 0\n', "schedules.nightly.catch_up_max", ["too small"]),
    ('every = "1h"\ncatch_up_max = 1001\n', "schedules.nightly.catch_up_max", ["<= 1000"]),
    ('every = "1h"\ncatch_up_max = 100000000\n', "schedules.nightly.catch_up_max", ["too large"]),
    ('every = "1h"\noverlap = "queue"\n', "schedules.nightly.overlap", ["'queue'"]),
    ('every = "1h"\npayload = [1]\n', "schedules.nightly.payload", ["not a table"]),
    (
        'every = "1h"\npayload = { scheduled_for = 1 }\n',
        "schedules.nightly.payload.scheduled_for",
        ["set by fleetd"],
    ),
    ('every = "1h"\npayload = { at = 1979-05-27 }\n', "schedules.nightly.payload", ["not JSON"]),
    ('every = "1h"\npriority = "high"\n', "schedules.nightly.priority", ["not an integer"]),
    # what the database's columns hold (PostgreSQL refuses more: int4, varchar(200))
    ('every = "1h"\npriority = 2147483648\n', "schedules.nightly.priority", ["out of range"]),
    ('every = "1h"\npriority = -2147483649\n', "schedules.nightly.priority", ["-2147483648"]),
    (f'every = "1h"\ntenant = "{"t" * 201}"\n', "schedules.nightly.tenant", ["201 characters"]),
    ('every = "1h"\ncronn = "x"\n', "schedules.nightly.cronn", ["did you mean 'cron'"]),
]


@pytest.mark.parametrize(("lines", "key", "fragments"), SCHEDULE_ERRORS)
def test_schedule_errors(tmp_path: Path, lines: str, key: str, fragments: list[str]) -> None:
    message = error(tmp_path, schedule(lines))
    assert message.startswith(f"{key}: "), message
    assert "(expected " in message or "known: " in message, message
    for fragment in fragments:
        assert fragment in message, message


def test_schedule_of_an_unknown_kind(tmp_path: Path) -> None:
    text = REINDEX + '[schedules.nightly]\nkind = "render"\nevery = "1h"\n'
    message = error(tmp_path, text)
    assert message.startswith("schedules.nightly.kind: 'render' is not a kind of any pool")
    assert "'reindex'" in message
    assert error(tmp_path, REINDEX + "[schedules]\nx = 1\n").startswith("schedules.x: 1 is not")


def test_schedule_values_at_the_database_s_limits(tmp_path: Path) -> None:
    at_limits = f'every = "1h"\npriority = 2147483647\ntenant = "{"t" * 200}"\n'
    (spec,) = load(tmp_path, schedule(at_limits + "catch_up_max = 1000\n")).schedule_specs()
    assert spec.priority == 2**31 - 1 and spec.tenant == "t" * 200
    assert spec.catch_up_max == 1000
    (yearly,) = load(tmp_path, schedule('every = "366d"\n')).schedule_specs()
    assert yearly.timing.every == 366 * 86400
    assert load(tmp_path, schedule('every = "1h"\npriority = -2147483648\n')).schedules
    name = "n" * 200
    named = REINDEX + f'[schedules.{name}]\nkind = "reindex"\nevery = "1h"\n'
    assert list(load(tmp_path, named).schedules) == [name]
    message = error(tmp_path, named.replace(name, name + "n"))
    assert message.startswith("schedules: 'nnnnnnnnnnnnnnnnnnnn'... is 201 characters long")
    assert "at most 200" in message and "\n" not in message


# ---- slots ----


def test_slots_default_to_one_and_io_pools_take_more(tmp_path: Path) -> None:
    assert bulk(tmp_path, "").slots == 1
    assert bulk(tmp_path, 'bound = "io"\nslots = 20').slots == 20


@pytest.mark.parametrize(
    ("lines", "fragments"),
    [
        ("slots = 4", ['pools.bulk.slots: 4 needs bound = "io"']),
        ('bound = "io"\nslots = 0', ["pools.bulk.slots"]),
        ('bound = "io"\nslots = 2\nsoft_timeout = "1s"', ["pools.bulk.slots: 2 cannot raise"]),
        ('bound = "io"\nslots = 64\nnproc_limit = 64', ["pools.bulk.slots: 64 threads do not"]),
    ],
)
def test_slots_errors(tmp_path: Path, lines: str, fragments: list[str]) -> None:
    text = f'[pools.bulk]\nhandlers = {{ x = "m:f" }}\n{lines}\n'
    message = error(tmp_path, text)
    assert "\n" not in message
    for fragment in fragments:
        assert fragment in message


def test_slots_refuse_command_handlers(tmp_path: Path) -> None:
    text = '[pools.bulk]\nhandlers = { x = { command = ["true"] } }\nbound = "io"\nslots = 3\n'
    message = error(tmp_path, text)
    assert "pools.bulk.slots: 3 cannot run command handlers (x)" in message
