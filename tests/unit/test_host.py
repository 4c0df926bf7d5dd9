"""Host facts and the cgroup memory detection: on this machine (whatever it has), and on fake
/proc and cgroup trees built in a temporary folder for each branch of the detection."""

from __future__ import annotations

import os
from pathlib import Path

from supervisor import host


def test_detection_on_this_host_returns_a_documented_mechanism_with_a_reason() -> None:
    found = host.memory_cgroup()
    print(f"memory cgroup mechanism here: {found.describe()}")
    assert found.mechanism in host.MECHANISMS
    assert isinstance(found.reason, str) and found.reason
    assert "\n" not in found.reason
    assert (found.path is None) == (found.mechanism == "none")
    assert found.available == (found.mechanism != "none")
    if found.path is not None:
        assert found.path.is_dir()
        assert not list(found.path.glob("fleetd-probe-*"))  # the probe cleaned up


def test_cores_and_memory_are_sane() -> None:
    assert 1 <= host.usable_cores() <= host.cores() <= (os.cpu_count() or 1)
    total = host.total_memory()
    assert total > 64 * 2**20
    limit = host.cgroup_memory_limit()
    assert limit is None or total <= limit


def fake_proc(tmp: Path, cgroup: str, mounts: list[str]) -> str:
    proc = tmp / "proc"
    proc.mkdir()
    (proc / "cgroup").write_text(cgroup)
    (proc / "mountinfo").write_text("".join(line + "\n" for line in mounts))
    return str(proc)


def mountinfo(point: Path, fstype: str, options: str, root: str = "/") -> str:
    where = str(point).replace(" ", "\\040")
    return f"35 31 0:32 {root} {where} rw,relatime shared:1 - {fstype} cgroup rw,{options}"


def test_paths_are_resolved_against_the_mount_root(tmp_path: Path) -> None:
    memory = tmp_path / "with space" / "memory"
    proc = fake_proc(
        tmp_path,
        "4:memory:/outer/inner/me\n3:cpu,cpuacct:/\n0::/\n",
        [mountinfo(memory, "cgroup", "memory", root="/outer"), mountinfo(tmp_path, "tmpfs", "")],
    )
    assert host.cgroup_paths(proc) == {
        "memory": "/outer/inner/me",
        "cpu": "/",
        "cpuacct": "/",
        "": "/",
    }
    assert host.cgroup_dir("memory", proc) == memory / "inner" / "me"
    assert host.cgroup_dir("", proc) is None  # no cgroup2 mount
    assert host.cgroup_dir("cpu", proc) is None  # not mounted


def test_no_cgroup_mounts_means_none_with_both_reasons(tmp_path: Path) -> None:
    found = host.memory_cgroup(fake_proc(tmp_path, "0::/\n", []))
    assert found.mechanism == "none" and found.path is None
    assert "no cgroup2 hierarchy mounted" in found.reason
    assert "no cgroup v1 memory hierarchy mounted" in found.reason


def test_v2_without_a_memory_controller_says_which_controllers_it_has(tmp_path: Path) -> None:
    unified = tmp_path / "unified"
    (unified / "me").mkdir(parents=True)
    (unified / "me" / "cgroup.controllers").write_text("hugetlb\n")
    found = host.memory_cgroup(fake_proc(tmp_path, "0::/me\n", [mountinfo(unified, "cgroup2", "")]))
    assert found.mechanism == "none"
    assert "has no memory controller (controllers: hugetlb)" in found.reason


def test_v2_with_memory_delegated_to_children(tmp_path: Path) -> None:
    unified = tmp_path / "unified"
    (unified / "me").mkdir(parents=True)
    (unified / "me" / "cgroup.controllers").write_text("cpu memory pids\n")
    (unified / "me" / "cgroup.subtree_control").write_text("memory\n")
    found = host.memory_cgroup(fake_proc(tmp_path, "0::/me\n", [mountinfo(unified, "cgroup2", "")]))
    assert (found.mechanism, found.path) == ("v2", unified / "me")


def test_v1_directory_that_is_not_a_cgroup_is_refused(tmp_path: Path) -> None:
    # A plain folder accepts mkdir, but its child has no memory.limit_in_bytes: not cgroupfs.
    memory = tmp_path / "memory"
    (memory / "me").mkdir(parents=True)
    (memory / "me" / "memory.limit_in_bytes").write_text("9223372036854771712\n")
    proc = fake_proc(tmp_path, "4:memory:/me\n0::/\n", [mountinfo(memory, "cgroup", "memory")])
    found = host.memory_cgroup(proc)
    assert found.mechanism == "none"
    assert "has no memory.limit_in_bytes" in found.reason
    assert list((memory / "me").iterdir()) == [memory / "me" / "memory.limit_in_bytes"]
