"""``workers.tree``'s private /dev/shm bookkeeping, on a real tmpfs (mounting one needs root)."""

from __future__ import annotations

import ctypes
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from workers import limits, tree

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="mounting a tmpfs needs root")


@pytest.fixture
def shm(tmp_path: Path) -> Iterator[Path]:
    """A fresh 8 MiB tmpfs, as a worker's private /dev/shm is."""
    where = tmp_path / "shm"
    where.mkdir()
    c = limits.libc()
    assert c is not None
    if c.mount(b"tmpfs", str(where).encode(), b"tmpfs", 0, b"mode=1777,size=8388608") != 0:
        pytest.fail(f"mount: {os.strerror(ctypes.get_errno())}")
    try:
        yield where
    finally:
        assert c.umount2(str(where).encode(), 2) == 0  # MNT_DETACH


def _leave_file(where: Path) -> None:
    (where / "left").write_bytes(b"x" * 4096)


def _leave_empty_file(where: Path) -> None:
    (where / "empty").touch()


def _leave_folder(where: Path) -> None:
    (where / "a" / "b").mkdir(parents=True)


def _leave_link(where: Path) -> None:
    (where / "link").symlink_to("/nowhere")


@pytest.mark.parametrize("leave", [_leave_file, _leave_empty_file, _leave_folder, _leave_link])
def test_whatever_a_job_leaves_is_removed(shm: Path, leave) -> None:
    empty = tree.shm_baseline(str(shm))
    assert empty is not None
    leave(shm)
    assert os.listdir(shm)
    assert tree.shm_after_job(empty, str(shm)) is False
    assert os.listdir(shm) == []
    assert tree.shm_baseline(str(shm)) == empty


def test_a_file_deleted_but_still_open_does_not_hide_what_is_left(shm: Path) -> None:
    empty = tree.shm_baseline(str(shm))
    fd = os.open(shm / "held", os.O_CREAT | os.O_RDWR)
    try:
        os.write(fd, b"x" * 8192)
        os.unlink(shm / "held")
        (shm / "also").touch()  # one more inode, one more block user: still listed
        tree.shm_after_job(empty, str(shm))
        assert os.listdir(shm) == []
    finally:
        os.close(fd)


def test_an_empty_one_is_not_listed_and_one_holding_anything_is(shm: Path, monkeypatch) -> None:
    fresh = tree.shm_baseline(str(shm))
    assert fresh is not None and fresh.inodes == 1  # its root's
    listed = []
    real = tree.empty_shm
    monkeypatch.setattr(tree, "empty_shm", lambda where: listed.append(where) or real(where))
    tree.shm_after_job(fresh, str(shm))
    assert listed == []
    _leave_empty_file(shm)
    tree.shm_after_job(fresh, str(shm))
    assert listed == [str(shm)]
    assert os.listdir(shm) == []


def test_an_unknown_empty_count_lists_every_time(shm: Path) -> None:
    fresh = tree.shm_baseline(str(shm))
    assert fresh is not None
    _leave_empty_file(shm)
    tree.shm_after_job(fresh._replace(inodes=None), str(shm))
    assert os.listdir(shm) == []


def test_remounted_without_inode_or_size_counts_it_is_still_emptied(shm: Path) -> None:
    fresh = tree.shm_baseline(str(shm))
    c = limits.libc()
    assert c is not None
    remount = 32  # MS_REMOUNT: a root job may do this to its worker's tmpfs
    assert c.mount(b"tmpfs", str(shm).encode(), b"tmpfs", remount, b"nr_inodes=0,size=0") == 0
    _leave_file(shm)
    st = os.statvfs(shm)
    assert (st.f_files, st.f_blocks) == (0, 0)  # the counts say nothing now
    tree.shm_after_job(fresh, str(shm))
    assert os.listdir(shm) == []


def test_another_filesystem_in_its_place_is_never_emptied(shm: Path, tmp_path: Path) -> None:
    fresh = tree.shm_baseline(str(shm))
    other = tmp_path / "other"  # not the tmpfs: what a root job's unmount would uncover
    other.mkdir()
    (other / "hosts-file").touch()
    tree.shm_after_job(fresh, str(other))
    assert os.listdir(other) == ["hosts-file"]


def test_a_filled_one_says_so(shm: Path) -> None:
    empty = tree.shm_baseline(str(shm))
    with open(shm / "fill", "wb") as f, pytest.raises(OSError):
        f.write(b"x" * (9 << 20))  # past the 8 MiB size: ENOSPC
    assert tree.shm_after_job(empty, str(shm)) is True
    assert os.listdir(shm) == []
    assert tree.shm_after_job(empty, str(shm)) is False
