"""``fleetd check`` says which memory mechanisms are active per pool (text and JSON), next to
the keys it always had."""

from __future__ import annotations

from pathlib import Path

import pytest

from supervisor import host
from supervisor.check import plan_for, render_plan
from workers.limits import DEFAULT_HEADROOM

REPO = Path(__file__).resolve().parents[2]
MIB = 1024 * 1024


def write(tmp_path: Path, cgroup: bool = True) -> str:
    path = tmp_path / "fleet.toml"
    path.write_text(
        "[fleet]\n"
        f'python_path = ["{REPO}"]\n'
        f"memory_cgroup = {'true' if cgroup else 'false'}\n"
        "[pools.capped]\n"
        'handlers = { echo = "tests.support.handlers:echo" }\n'
        'memory_limit = "256MiB"\n'
        "[pools.free]\n"
        'handlers = { noop = "tests.support.handlers:noop" }\n'
        "memory_limit = false\n"
    )
    return str(path)


def test_plan_lists_the_mechanisms_per_pool(tmp_path: Path) -> None:
    plan = plan_for(write(tmp_path))
    capped, free = plan["pools"]["capped"], plan["pools"]["free"]
    for key in ("kinds", "min_workers", "max_workers", "bound", "memory_limit", "timeout"):
        assert key in capped
    assert plan["memory_cgroup"]["mechanism"] in host.MECHANISMS
    assert plan["memory_cgroup"]["reason"]
    assert plan["host"]["cores"] >= 1 and plan["host"]["memory"] > 0
    memory = capped["memory"]
    assert memory["rlimit"] == {"resource": "RLIMIT_DATA", "value": 256 * MIB + DEFAULT_HEADROOM}
    assert memory["watchdog"]["period"] == pytest.approx(0.02)
    if plan["memory_cgroup"]["mechanism"] == "none":
        assert memory["cgroup"] is None
    else:
        assert memory["cgroup"]["limit"] == 256 * MIB + 128 * MIB
    assert free["memory"] == {"rlimit": None, "watchdog": None, "cgroup": None}

    text = render_plan(plan)
    assert f"memory cgroups: {plan['memory_cgroup']['mechanism']} (" in text
    assert (
        "memory: RLIMIT_DATA 384MiB (+ the VmData-RSS gap at fork); RSS watchdog every 20ms" in text
    )
    assert "memory: no memory_limit: no rlimit, no RSS watchdog, no cgroup" in text


def test_a_pool_with_slots_shows_the_rlimit_with_its_threads_stacks(tmp_path: Path) -> None:
    path = tmp_path / "fleet.toml"
    path.write_text(
        f'[fleet]\npython_path = ["{REPO}"]\n[pools.io]\n'
        'handlers = { echo = "tests.support.handlers:echo" }\n'
        'bound = "io"\nslots = 20\nmemory_limit = "256MiB"\n'
    )
    rlimit = plan_for(str(path))["pools"]["io"]["memory"]["rlimit"]
    # 21 stacks (20 slots and the event loop's thread) of 8 MiB and a 64 KiB guard each
    assert rlimit["value"] == 256 * MIB + DEFAULT_HEADROOM + 21 * (8 * MIB + 64 * 1024)


def test_memory_cgroup_false_switches_the_cgroup_off(tmp_path: Path) -> None:
    plan = plan_for(write(tmp_path, cgroup=False))
    assert plan["memory_cgroup"]["mechanism"] == "none"
    assert "memory_cgroup = false" in plan["memory_cgroup"]["reason"]
    assert plan["pools"]["capped"]["memory"]["cgroup"] is None
    assert "no cgroup" in render_plan(plan)


@pytest.mark.parametrize(
    ("ready", "msg", "status", "says"),
    [
        (False, None, None, "no Ready within 10 s"),
        (True, None, 82 << 8, "exited with code 82 (SETUP_FAILED); its stderr says why"),
        (True, None, 9, "killed by SIGKILL"),
        (True, None, None, "closed its socket and did not exit"),
    ],
)
def test_a_measuring_worker_that_sends_no_ready_is_reported_with_the_reason(
    ready, msg, status, says
) -> None:
    from supervisor.check import not_ready_reason

    reason = not_ready_reason(ready, msg, status)
    assert reason.startswith("the worker did not start: ") and says in reason


def test_a_measuring_worker_that_sends_another_frame_is_named() -> None:
    from supervisor.check import not_ready_reason
    from workers import protocol

    assert "it sent Pong instead of Ready" in not_ready_reason(True, protocol.Pong(1, None), None)
