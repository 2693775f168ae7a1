"""Quotas (EDQUOT) are full disks (ENOSPC) in other words: unit checks, and a real quota where there is one.

A real quota here is a btrfs qgroup limit on a subvolume of a loop-mounted btrfs image, made and removed by
the test as root (qgroup limits bind root too, so no other uid is needed). tmpfs quotas
(CONFIG_TMPFS_QUOTA) and ext4/xfs quotas (CONFIG_QFMT_V2, CONFIG_XFS_QUOTA) are kernel options many kernels
lack; btrfs qgroups need only btrfs and btrfs-progs. Where any of that is missing these tests skip with the
reason.

The real-quota save (test_a_quota_hit_during_a_save_is_one_line_and_keeps_the_previous_checkpoint) holds
what is EDQUOT's own: the "quota exceeded" line, quota=True in the summary, the partial save removed, the
previous checkpoint complete. That a re-run after freeing room resumes from it and completes is the same
resume code whatever the errno: tests/test_diskspace.py::
test_out_of_space_during_a_save_is_one_line_and_a_rerun_resumes holds it.
"""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.diskfull import assert_said_once, launch, one_checkpoint
from tests.support.runs import clean_env, finish, seed_preflight, summary
from trainer.checkpoint.diskspace import OutOfSpace, SpaceReport, find_out_of_space, guard, short_of_room
from trainer.checkpoint.layout import scan
from trainer.data.cache import store as cache_mod

# --- unit level: EDQUOT is matched wherever ENOSPC is --------------------------------------------------


@pytest.mark.fast
def test_guard_turns_edquot_into_a_quota_out_of_space(tmp_path):
    with pytest.raises(OutOfSpace) as info:
        with guard(tmp_path / "f", "summary write", needed=123):
            raise OSError(errno.EDQUOT, os.strerror(errno.EDQUOT), str(tmp_path / "f"))
    exc = info.value
    assert exc.errno == errno.EDQUOT and exc.report.quota and exc.report.needed == 123
    line = exc.line(keep=3)
    assert line.startswith("quota exceeded on ") and "during the summary write of" in line
    assert (
        "none left in the quota" in line and "raise the quota" in line and "checkpoint.keep (now 3)" in line
    )


@pytest.mark.fast
def test_an_edquot_inside_a_dcp_style_failure_is_found(tmp_path):
    class CheckpointException(BaseException):  # DCP's shape: {rank: (exception, traceback)}
        def __init__(self, failures):
            self.failures = failures

    inner = OSError(errno.EDQUOT, os.strerror(errno.EDQUOT), str(tmp_path / "__0_0.distcp"))
    found = find_out_of_space(CheckpointException({1: (inner, None)}), "checkpoint save", tmp_path)
    assert found is not None and found.report.quota and found.errno == errno.EDQUOT
    assert found.report.path == str(tmp_path / "__0_0.distcp")
    assert find_out_of_space(OSError(errno.EACCES, "denied"), "checkpoint save", tmp_path) is None


@pytest.mark.fast
def test_a_quota_report_survives_the_rank_record(tmp_path):
    exc = OutOfSpace("latent cache", tmp_path / "e.npz", needed=10, quota=True)
    back = OutOfSpace.from_json(exc.to_json())
    assert back is not None and back.errno == errno.EDQUOT and back.line() == exc.line()
    assert "data.cache_dir" in back.line() and "checkpoint.keep" not in back.line()
    assert OutOfSpace.of(SpaceReport(**exc.to_json())).report == exc.report


@pytest.mark.fast
def test_the_cache_writer_says_edquot_as_a_quota(tmp_path, monkeypatch):
    def over_quota(path, data, **kwargs):
        raise OSError(errno.EDQUOT, os.strerror(errno.EDQUOT))

    monkeypatch.setattr(cache_mod, "write_atomic", over_quota)
    with pytest.raises(OutOfSpace) as info:
        cache_mod._write_bytes(tmp_path / "episodes" / "a.npz", b"x" * 1000)
    assert info.value.report.quota and info.value.report.needed == 1000
    assert info.value.report.path == str(tmp_path / "episodes" / "a.npz")


@pytest.mark.fast
def test_short_of_room_without_a_quota_uses_statvfs(tmp_path):
    assert short_of_room(tmp_path, "checkpoint save", None) is None  # no estimate: cannot tell
    assert short_of_room(tmp_path, "checkpoint save", 4096) is None
    huge = short_of_room(tmp_path, "checkpoint save", 1 << 62)
    assert huge is not None and not huge.report.quota and huge.report.needed == 1 << 62
    assert list(tmp_path.iterdir()) == []  # no probe left behind


# --- a real quota: btrfs qgroups -----------------------------------------------------------------------


def _run(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(list(argv), capture_output=True, text=True)


class BtrfsQuota:
    """A loop-mounted btrfs with quotas on; `path` is a subvolume whose qgroup limit is `limit` bytes."""

    def __init__(self, root: Path, limit: int):
        if os.geteuid() != 0:
            pytest.skip("mounting a loop btrfs needs root")
        if not (shutil.which("mkfs.btrfs") and shutil.which("btrfs")):
            pytest.skip(
                "btrfs-progs is not installed (apt-get install btrfs-progs): no real quota to test on"
            )
        root.mkdir(parents=True, exist_ok=True)
        self.image, self.mount = root / "quota.img", root / "mnt"
        self.mount.mkdir()
        with open(self.image, "wb") as f:
            f.truncate(512 << 20)  # sparse
        self.mounted = False
        for argv, what in (
            (("mkfs.btrfs", "-q", "-f", str(self.image)), "mkfs.btrfs"),
            (("mount", "-o", "loop", str(self.image), str(self.mount)), "a loop mount of btrfs"),
            (("btrfs", "quota", "enable", str(self.mount)), "btrfs quotas"),
            (("btrfs", "subvolume", "create", str(self.mount / "sub")), "a btrfs subvolume"),
        ):
            out = _run(*argv)
            if out.returncode != 0:
                self.umount()
                pytest.skip(f"{what} refused here ({out.stderr.strip() or out.returncode})")
            self.mounted = self.mounted or argv[0] == "mount"
        self.path = self.mount / "sub"
        self.limit(limit)

    def limit(self, size: int) -> None:
        subprocess.run(
            ["btrfs", "qgroup", "limit", str(size), str(self.path)], check=True, capture_output=True
        )

    def umount(self) -> None:
        if self.mounted and _run("umount", str(self.mount)).returncode != 0:
            _run("umount", "-l", str(self.mount))
        self.mounted = False


@pytest.fixture
def quota(tmp_path) -> Iterator:
    made: list[BtrfsQuota] = []

    def make(limit: int) -> BtrfsQuota:
        made.append(BtrfsQuota(tmp_path / f"q{len(made)}", limit))
        return made[-1]

    yield make
    for q in made:
        q.umount()


@pytest.mark.heavy
def test_a_real_quota_gives_edquot_and_the_cache_writer_leaves_nothing(quota):
    q = quota(2 << 20)
    entry = q.path / "episodes" / "big.npz"
    with pytest.raises(OutOfSpace) as info:
        cache_mod._write_bytes(entry, b"\1" * (8 << 20))
    exc = info.value
    assert exc.errno == errno.EDQUOT and exc.report.quota, exc  # the kernel's errno: 122, not 28
    assert exc.report.fstype == "btrfs" and exc.report.mount_point == str(q.mount)
    assert exc.report.path == str(entry) and exc.report.needed == 8 << 20
    assert (exc.report.free or 0) > 8 << 20  # statvfs sees the filesystem's room, not the quota
    assert list((q.path / "episodes").iterdir()) == []  # the temporary file is gone
    q.limit(64 << 20)
    cache_mod._write_bytes(entry, b"\1" * (8 << 20))  # room in the quota again: the same write works
    assert entry.stat().st_size == 8 << 20


@pytest.mark.heavy
def test_short_of_room_sees_a_quota_that_statvfs_does_not(quota):
    q = quota(4 << 20)
    (q.path / "held").write_bytes(b"\1" * (3 << 20))
    os.sync()  # qgroup accounting is settled at the transaction commit
    short = short_of_room(q.path, "checkpoint save", 2 << 20)
    assert short is not None and short.report.quota and short.errno == errno.EDQUOT
    assert (short.report.free or 0) > 2 << 20  # statvfs alone would have said there is room
    assert short_of_room(q.path, "checkpoint save", 256 << 10) is None
    assert sorted(p.name for p in q.path.iterdir()) == ["held"]  # the probe is removed


@pytest.mark.heavy
def test_a_quota_hit_generating_episodes_leaves_no_half_dataset(quota):
    from trainer.data.formats.generate import generate_dataset

    q = quota(2 << 20)  # one collector-format episode of 20 steps is about 6 MiB
    with pytest.raises(OutOfSpace) as info:
        generate_dataset(q.path / "furniture", episodes=2, length=20)
    assert info.value.report.quota and info.value.report.what == "dataset generation"
    assert "data.cache_dir" in info.value.line()
    assert list(q.path.iterdir()) == []  # the temporary dataset directory is removed at once


@pytest.mark.heavy
@pytest.mark.slow
def test_a_quota_hit_during_a_save_is_one_line_and_keeps_the_previous_checkpoint(
    quota, tmp_path, preflight_record
):
    (tmp_path / "no-envs").mkdir()
    base_env = clean_env(tmp_path / "no-envs")
    data_dir = tmp_path / "episodes" / "furniture"  # generated by the first launch
    one = one_checkpoint()
    q = quota(int(one * 1.6))  # one checkpoint fits in the quota, the second save exceeds it
    run_dir = q.path / "run"
    seed_preflight(run_dir, preflight_record)
    # one rank: a 2-rank save failing in one line is test_diskspace's; the claims here are the quota's
    rc, out, err = finish(launch(run_dir, data_dir, base_env, nproc=1))  # the preflight cannot see a quota
    assert rc == 1, err
    line = assert_said_once(err, q, limit="quota exceeded", fstype="btrfs")
    assert "during the checkpoint save of" in line and "none left in the quota" in line
    s = summary(run_dir)
    assert s["status"] == "failed" and s["exit_code"] == 1 and s["out_of_space"]["quota"] is True
    root = run_dir / "checkpoints"
    assert not [p for p in root.iterdir() if ".tmp-" in p.name]  # the partial one is gone at once
    complete, _ = scan(root)
    assert [c.step for c in complete] == [2]  # a re-run's resume from it: test_diskspace.py
